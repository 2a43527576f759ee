// The page's DOM: messages (an assistant's as Markdown, with its reasoning folded under it and its
// speeds below) and the side bar's list of conversations.

import { el, render } from './markdown.js';

function button(label, onClick, className = 'subtle') {
  const node = el('button', className, label);
  node.type = 'button';
  node.addEventListener('click', onClick);
  return node;
}

function rate(n, perSecond) {
  return `${n} token${n === 1 ? '' : 's'}, ${perSecond.toFixed(1)} t/s`;
}

// llama-server's timings: prompt_n tokens evaluated (cache_n more came from the prefix cache).
export function speeds(t) {
  const cached = t.cache_n ? ` (+${t.cache_n} cached)` : '';
  return `Prompt: ${rate(t.prompt_n, t.prompt_per_second)}${cached} · Generation: ${rate(t.predicted_n, t.predicted_per_second)}`;
}

const ENDINGS = { stopped: 'Stopped.', length: 'Cut at the token limit.' };

// Fills an assistant message's node; `streaming` leaves out what is only known at its end.
export function fillAssistant(node, message, streaming = false) {
  const body = el('div', 'body');
  body.append(render(message.content));
  const parts = [body];
  if (message.reasoning) {
    const fold = el('details', 'reasoning');
    fold.open = node.querySelector('details.reasoning')?.open ?? false;
    fold.append(el('summary', null, streaming && !message.content ? 'Thinking…' : 'Reasoning'),
      el('div', 'reasoning-body', message.reasoning));
    parts.push(fold);
  }
  if (message.error) parts.push(el('p', 'error', message.error));
  const meta = [message.timings ? speeds(message.timings) : '', ENDINGS[message.finish] ?? ''].filter(Boolean);
  if (meta.length && !streaming) parts.push(el('p', 'meta', meta.join(' · ')));
  node.classList.toggle('streaming', streaming);
  node.replaceChildren(...parts);
}

// actions: {regenerate, edit} for the last exchange's buttons, or {} for earlier messages.
export function messageNode(message, actions) {
  const node = el('article', `message ${message.role}`);
  if (message.role === 'assistant') fillAssistant(node, message);
  else node.append(el('div', 'body', message.content));
  const row = el('div', 'actions');
  if (message.role === 'assistant' && actions.regenerate) row.append(button('Regenerate', actions.regenerate));
  if (message.role === 'user' && actions.edit) row.append(button('Edit', () => editIn(node, message, actions.edit)));
  const wrap = el('div', `turn ${message.role}`);
  wrap.append(node);
  if (row.childElementCount) wrap.append(row);
  return wrap;
}

function editIn(node, message, resend) {
  const box = el('textarea', 'edit');
  box.value = message.content;
  box.rows = Math.min(12, message.content.split('\n').length + 1);
  const restore = () => node.replaceChildren(el('div', 'body', message.content));
  const send = () => { if (box.value.trim()) resend(box.value); };
  box.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    if (e.key === 'Escape') restore();
  });
  const row = el('div', 'actions');
  row.append(button('Cancel', restore), button('Send', send, 'primary'));
  node.replaceChildren(box, row);
  box.focus();
}

// handlers: {open(id), rename(id, title), remove(id)}
export function conversationList(conversations, currentId, handlers) {
  return conversations.map((c) => {
    const item = el('li', c.id === currentId ? 'current' : '');
    const title = button(c.title, () => handlers.open(c.id), 'title');
    title.title = c.title;
    const rename = button('✎', () => {
      const field = el('input', 'rename');
      field.value = c.title;
      let finished = false;   // Enter renames, and the blur that follows must not rename again
      const done = (keep) => {
        if (finished) return;
        finished = true;
        handlers.rename(c.id, keep ? field.value.trim() || c.title : c.title);
      };
      field.addEventListener('keydown', (e) => {
        if (e.key === 'Enter') done(true);
        if (e.key === 'Escape') done(false);
      });
      field.addEventListener('blur', () => done(true));
      item.replaceChildren(field);
      field.focus();
      field.select();
    }, 'icon');
    rename.setAttribute('aria-label', 'Rename');
    const remove = button('×', () => {
      if (remove.classList.contains('confirm')) handlers.remove(c.id);
      else { remove.classList.add('confirm'); remove.textContent = 'Delete?'; }
    }, 'icon');
    remove.setAttribute('aria-label', 'Delete');
    item.append(title, rename, remove);
    return item;
  });
}
