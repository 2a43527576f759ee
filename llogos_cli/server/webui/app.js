// The chat page: a conversation streamed from /v1/chat/completions, kept in localStorage, with the
// model's name and context size and the sampling defaults from /v1/models and /props.

import * as api from './api.js';
import * as settings from './settings.js';
import * as store from './store.js';
import * as view from './view.js';

const CONTEXT_WARNING = 0.8;   // the share of the context a conversation may fill before the page warns
const LOADING_RETRY_MS = 1000;

const $ = (id) => document.getElementById(id);
const state = { nCtx: 0, conversation: store.newConversation(), controller: null };

function status(text) {
  $('status').textContent = text;
  $('status').hidden = !text;
}

function contextWarning() {
  const used = state.conversation.usage ?? 0;
  if (state.nCtx && used >= CONTEXT_WARNING * state.nCtx) {
    status(`This conversation fills ${used} of the context's ${state.nCtx} tokens: start a new chat `
      + 'before it runs out.');
  } else status('');
}

function scrollDown() {
  const box = $('messages');
  box.scrollTop = box.scrollHeight;
}

function renderSidebar() {
  const handlers = {
    open: (id) => {
      const found = store.conversations().find((c) => c.id === id);
      if (found && !state.controller) show(found);
      document.body.classList.remove('sidebar-open');
    },
    rename: (id, title) => {
      const c = id === state.conversation.id ? state.conversation : store.conversations().find((x) => x.id === id);
      c.title = title;
      store.saveConversation(c);
      renderSidebar();
    },
    remove: (id) => {
      store.deleteConversation(id);
      if (id === state.conversation.id) show(store.newConversation());
      else renderSidebar();
    },
  };
  $('conversations').replaceChildren(...view.conversationList(store.conversations(), state.conversation.id, handlers));
}

function renderMessages() {
  const { messages } = state.conversation;
  const idle = !state.controller;
  const lastUser = messages.findLastIndex((m) => m.role === 'user');
  const nodes = messages.map((m, i) => view.messageNode(m, {
    regenerate: idle && i === messages.length - 1 && m.role === 'assistant' ? regenerate : null,
    edit: idle && i === lastUser ? resendEdited : null,
  }));
  $('empty').hidden = messages.length > 0;
  $('messages').replaceChildren($('empty'), ...nodes);
  scrollDown();
}

function show(conversation) {
  state.conversation = conversation;
  renderMessages();
  renderSidebar();
  contextWarning();
}

function busy(on) {
  $('send').hidden = on;
  $('stop').hidden = !on;
}

async function reply() {
  const conversation = state.conversation;
  const message = { role: 'assistant', content: '', reasoning: '' };
  const history = conversation.messages.map(({ role, content }) => ({ role, content }));
  conversation.messages.push(message);
  state.controller = new AbortController();
  busy(true);
  renderMessages();
  const node = $('messages').lastElementChild.querySelector('.message');
  let painting = false;
  const paint = () => {
    painting = false;
    view.fillAssistant(node, message, true);
    scrollDown();
  };
  const body = { ...settings.apply(history), stream: true, stream_options: { include_usage: true } };
  try {
    const end = await api.streamChat(body, store.apiKey(), state.controller.signal, (delta) => {
      message.content += delta.content ?? '';
      message.reasoning += delta.reasoning_content ?? '';
      if (!painting) {
        painting = true;
        requestAnimationFrame(paint);
      }
    });
    Object.assign(message, { finish: end.finish, timings: end.timings });
    conversation.usage = end.usage?.total_tokens ?? conversation.usage;
  } catch (e) {
    if (e.name === 'AbortError') message.finish = 'stopped';
    else message.error = e.message;
    if (e.status === 401) askKey();
  } finally {
    state.controller = null;
    busy(false);
    store.saveConversation(conversation);
    renderMessages();
    renderSidebar();
    contextWarning();
  }
}

function send() {
  const text = $('input').value;
  if (!text.trim() || state.controller) return;
  $('input').value = '';
  const conversation = state.conversation;
  if (!conversation.messages.length) conversation.title = store.titleFrom(text);
  conversation.messages.push({ role: 'user', content: text });
  reply();
}

function regenerate() {
  state.conversation.messages.pop();
  reply();
}

function resendEdited(text) {
  const { messages } = state.conversation;
  messages.splice(messages.findLastIndex((m) => m.role === 'user'));
  messages.push({ role: 'user', content: text });
  if (messages.length === 1) state.conversation.title = store.titleFrom(text);
  reply();
}

function exportAll() {
  const blob = new Blob([JSON.stringify(store.conversations(), null, 2)], { type: 'application/json' });
  const link = document.createElement('a');
  link.href = URL.createObjectURL(blob);
  link.download = `llogos-conversations-${new Date().toISOString().slice(0, 10)}.json`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 0);
}

function askKey(message = '') {
  $('key-error').textContent = message;
  $('key-error').hidden = !message;
  if (!$('key-dialog').open) $('key-dialog').showModal();
  $('key-input').focus();
}

// The model's name and context, and the server's sampling defaults; asks for the key on a 401.
async function connect() {
  const key = store.apiKey();
  try {
    const [models, props] = await Promise.all([api.getJson('v1/models', key), api.getJson('props', key)]);
    const name = models.data?.[0]?.id ?? 'model';
    state.nCtx = props.default_generation_settings?.n_ctx ?? 0;
    settings.setDefaults(props.default_generation_settings?.params);
    $('model-name').textContent = name;
    $('model-ctx').textContent = state.nCtx ? `${state.nCtx.toLocaleString('en')} tokens of context` : '';
    document.title = `${name} · llogos`;
    status('');
    contextWarning();
  } catch (e) {
    if (e.status === 401) askKey(key ? 'The server refused this key.' : '');
    else {
      status(e.status === 503 ? 'The model is loading…' : `Cannot reach the server: ${e.message}`);
      setTimeout(connect, LOADING_RETRY_MS);
    }
  }
}

function wire() {
  $('send').addEventListener('click', send);
  $('stop').addEventListener('click', () => state.controller?.abort());
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $('new-chat').addEventListener('click', () => {
    if (state.controller) return;
    show(store.newConversation());
    document.body.classList.remove('sidebar-open');
    $('input').focus();
  });
  $('export').addEventListener('click', exportAll);
  $('menu').addEventListener('click', () => document.body.classList.toggle('sidebar-open'));
  $('scrim').addEventListener('click', () => document.body.classList.remove('sidebar-open'));
  $('save-key').addEventListener('click', () => {
    store.saveApiKey($('key-input').value.trim());
    $('key-dialog').close();
    connect();
  });
  $('key-input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter') $('save-key').click();
  });
  settings.wire(() => {});
}

wire();
show(store.conversations()[0] ?? store.newConversation());
connect();
$('input').focus();
