// What the page keeps in the browser's localStorage: the conversations, the settings the user
// changed from the server's defaults, and the API key.

const CONVERSATIONS = 'llogos.conversations';
const SETTINGS = 'llogos.settings';
const API_KEY = 'llogos.apiKey';
const TITLE_LENGTH = 48;

function read(key, fallback) {
  try {
    return JSON.parse(localStorage.getItem(key)) ?? fallback;
  } catch {
    return fallback;   // a value another page version wrote, or one edited by hand
  }
}

export function conversations() {
  const all = read(CONVERSATIONS, []);
  return Array.isArray(all) ? all.sort((a, b) => b.updated - a.updated) : [];
}

export function saveConversation(conversation) {
  const others = conversations().filter((c) => c.id !== conversation.id);
  conversation.updated = Date.now();
  localStorage.setItem(CONVERSATIONS, JSON.stringify([conversation, ...others]));
}

export function deleteConversation(id) {
  localStorage.setItem(CONVERSATIONS, JSON.stringify(conversations().filter((c) => c.id !== id)));
}

export function newConversation() {
  const id = globalThis.crypto?.randomUUID?.() ?? `${Date.now()}-${Math.random().toString(16).slice(2)}`;
  return { id, title: 'New chat', created: Date.now(), updated: Date.now(), messages: [] };
}

export function titleFrom(text) {
  const line = text.trim().split('\n')[0];
  return line.length > TITLE_LENGTH ? `${line.slice(0, TITLE_LENGTH - 1)}…` : line || 'New chat';
}

export function settings() {
  return read(SETTINGS, {});
}

export function saveSettings(changed) {
  localStorage.setItem(SETTINGS, JSON.stringify(changed));
}

export function apiKey() {
  return localStorage.getItem(API_KEY) || '';
}

export function saveApiKey(key) {
  if (key) localStorage.setItem(API_KEY, key);
  else localStorage.removeItem(API_KEY);
}
