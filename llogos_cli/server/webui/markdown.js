// A small Markdown subset turned into DOM nodes (never into HTML strings, so a reply cannot inject
// markup): fenced code blocks with a copy button, headings, lists, quotes, rules, paragraphs, and
// inline code, emphasis, strike-through and links. Math ($...$, $$...$$, \(...\), \[...\]) is kept
// as its source text, untouched by emphasis, so it stays readable without a renderer.

const FENCE = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;

const INLINE = new RegExp([
  /(?<code>`+)(?<codeText>[\s\S]*?[^`])\k<code>(?!`)/,
  /(?<math>\$\$[\s\S]+?\$\$|\$[^$\s](?:[^$\n]*[^$\s])?\$(?!\d)|\\\([\s\S]+?\\\)|\\\[[\s\S]+?\\\])/,
  /\*\*(?<strong>[^*][\s\S]*?)\*\*|__(?<strong2>[^_][\s\S]*?)__(?![\w])/,
  /\*(?<em>[^*\s](?:[^*]*[^*\s])?)\*|(?<![\w])_(?<em2>[^_\s](?:[^_]*[^_\s])?)_(?![\w])/,
  /~~(?<del>[\s\S]+?)~~/,
  /\[(?<label>[^\]\n]+)\]\((?<href>[^)\s]+)\)/,
  /(?<url>https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])/,
].map((r) => r.source).join('|'));

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function link(label, href) {
  let url;
  try {
    url = new URL(href, document.baseURI);
  } catch {
    return document.createTextNode(`[${label}](${href})`);
  }
  if (!['http:', 'https:', 'mailto:'].includes(url.protocol)) return document.createTextNode(label);
  const a = el('a');
  a.href = url.href;
  a.target = '_blank';
  a.rel = 'noopener noreferrer';
  a.append(...inline(label));
  return a;
}

export function inline(text) {
  const nodes = [];
  let rest = text;
  while (rest) {
    const m = INLINE.exec(rest);
    if (!m) break;
    if (m.index) nodes.push(document.createTextNode(rest.slice(0, m.index)));
    const g = m.groups;
    if (g.code) nodes.push(el('code', null, g.codeText.replace(/^ (.+) $/, '$1')));
    else if (g.math) nodes.push(el('span', 'math', g.math));
    else if (g.strong || g.strong2) nodes.push(wrap('strong', g.strong || g.strong2));
    else if (g.em || g.em2) nodes.push(wrap('em', g.em || g.em2));
    else if (g.del) nodes.push(wrap('del', g.del));
    else if (g.label) nodes.push(link(g.label, g.href));
    else nodes.push(link(g.url, g.url));
    rest = rest.slice(m.index + m[0].length);
  }
  if (rest) nodes.push(document.createTextNode(rest));
  return nodes;
}

function wrap(tag, text) {
  const node = el(tag);
  node.append(...inline(text));
  return node;
}

async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = 'Copied';
  } catch {
    button.textContent = 'Copy failed';   // no clipboard outside a secure context (http on another host)
  }
  setTimeout(() => { button.textContent = 'Copy'; }, 1500);
}

function codeBlock(language, text) {
  const box = el('div', 'code-block');
  const head = el('div', 'code-head');
  const button = el('button', 'copy', 'Copy');
  button.type = 'button';
  button.addEventListener('click', () => copy(text, button));
  head.append(el('span', 'language', language || 'text'), button);
  const pre = el('pre');
  pre.append(el('code', null, text));
  box.append(head, pre);
  return box;
}

function list(lines, start, pattern, ordered) {
  const node = el(ordered ? 'ol' : 'ul');
  let i = start;
  let item = null;
  while (i < lines.length) {
    const m = pattern.exec(lines[i]);
    if (m) {
      if (ordered && i === start && m[1] !== '1') node.start = Number(m[1]);
      item = el('li');
      item.append(...inline(ordered ? m[2] : m[1]));
      node.append(item);
    } else if (item && /^\s{2,}\S/.test(lines[i])) {
      item.append(el('br'), ...inline(lines[i].trim()));
    } else break;
    i += 1;
  }
  return [node, i];
}

function blank(line) {
  return !line.trim();
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || BULLET.test(line) || NUMBERED.test(line)
    || QUOTE.test(line) || RULE.test(line);
}

// An unclosed fence (a reply still streaming) runs to the end, as a code block.
export function render(text) {
  const out = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (blank(line)) {
      i += 1;
    } else if ((m = FENCE.exec(line))) {
      const body = [];
      i += 1;
      while (i < lines.length && !(lines[i].trim().startsWith(m[1]) && blank(lines[i].trim().slice(m[1].length)))) {
        body.push(lines[i]);
        i += 1;
      }
      i += 1;
      out.append(codeBlock(m[2], body.join('\n')));
    } else if ((m = HEADING.exec(line))) {
      out.append(wrap(`h${m[1].length}`, m[2].replace(/\s#+\s*$/, '')));
      i += 1;
    } else if (RULE.test(line)) {
      out.append(el('hr'));
      i += 1;
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      const ordered = !BULLET.test(line);
      const [node, next] = list(lines, i, ordered ? NUMBERED : BULLET, ordered);
      out.append(node);
      i = next;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
        quoted.push(m[1]);
        i += 1;
      }
      const node = el('blockquote');
      node.append(render(quoted.join('\n')));
      out.append(node);
    } else {
      const para = [];
      while (i < lines.length && !blank(lines[i]) && (!para.length || !startsBlock(lines[i]))) {
        para.push(lines[i]);
        i += 1;
      }
      const p = el('p');
      p.append(...inline(para.join('\n')));   // its line breaks kept by the style sheet
      out.append(p);
    }
  }
  return out;
}
