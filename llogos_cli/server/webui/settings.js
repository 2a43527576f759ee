// The settings dialog: each field starts from the server's default (GET /props, what `llogos serve`
// was started with); only the values the user changed are kept and sent with a request.

import * as store from './store.js';

// name: the request's field; param: its name in /props' default_generation_settings.params.
const FIELDS = [
  { name: 'temperature', label: 'Temperature', param: 'temperature', min: 0, step: 0.05 },
  { name: 'top_k', label: 'Top-k', param: 'top_k', min: 0, step: 1 },
  { name: 'top_p', label: 'Top-p', param: 'top_p', min: 0, max: 1, step: 0.01 },
  { name: 'min_p', label: 'Min-p', param: 'min_p', min: 0, max: 1, step: 0.01 },
  { name: 'max_tokens', label: 'Max tokens', param: 'n_predict', min: -1, step: 1, minus: 'no limit' },
  { name: 'seed', label: 'Seed', param: 'seed', min: -1, step: 1, minus: 'random' },
];

let defaults = {};

export function setDefaults(params) {
  defaults = { system: '' };
  for (const f of FIELDS) defaults[f.name] = params?.[f.param];
}

export function changed() {
  return store.settings();
}

// The request's fields: the changed sampling values, and the system prompt as a first message.
export function apply(messages) {
  const { system, ...sampling } = changed();
  return { messages: system ? [{ role: 'system', content: system }, ...messages] : messages, ...sampling };
}

function input(field, value) {
  const node = document.createElement('input');
  Object.assign(node, { type: 'number', id: `setting-${field.name}`, name: field.name, step: field.step });
  if (field.min !== undefined) node.min = field.min;
  if (field.max !== undefined) node.max = field.max;
  node.value = value ?? '';
  return node;
}

function row(label, control, note) {
  const wrap = document.createElement('label');
  wrap.className = 'field';
  const text = document.createElement('span');
  text.textContent = label;
  wrap.append(text, control);
  if (note) {
    const hint = document.createElement('small');
    hint.textContent = note;
    wrap.append(hint);
  }
  return wrap;
}

function fill(values) {
  const box = document.getElementById('fields');
  const system = document.createElement('textarea');
  Object.assign(system, { id: 'setting-system', rows: 3, value: values.system ?? '' });
  const rows = [row('System prompt', system)];
  for (const f of FIELDS) {
    const note = [defaults[f.name] === undefined ? '' : `server: ${defaults[f.name]}`, f.minus && `-1: ${f.minus}`]
      .filter(Boolean).join(' · ');
    rows.push(row(f.label, input(f, values[f.name] ?? defaults[f.name]), note));
  }
  box.replaceChildren(...rows);
}

function read() {
  const out = {};
  const system = document.getElementById('setting-system').value;
  if (system.trim()) out.system = system;
  for (const f of FIELDS) {
    const node = document.getElementById(`setting-${f.name}`);
    if (node.value === '' || !node.checkValidity()) continue;
    const value = Number(node.value);
    if (value !== defaults[f.name]) out[f.name] = value;
  }
  return out;
}

export function wire(onSaved) {
  const dialog = document.getElementById('settings');
  document.getElementById('open-settings').addEventListener('click', () => {
    fill({ ...defaults, ...changed() });
    dialog.showModal();
  });
  document.getElementById('reset-settings').addEventListener('click', () => fill(defaults));
  document.getElementById('cancel-settings').addEventListener('click', () => dialog.close());
  document.getElementById('save-settings').addEventListener('click', () => {
    store.saveSettings(read());
    dialog.close();
    onSaved();
  });
}
