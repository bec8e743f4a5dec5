import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A local stand-in for a REAL clone site (the real ones are hosted, closed-source services), speaking the
 * protocol the harness relies on:
 *   - `/config?run_id&task_id&latency`: client-side JS sets up a fresh persisted state (localStorage) for the task;
 *   - `/finish`: client-side JS renders the persisted state as JSON inside `<pre>` (optionally after a delay,
 *     with a "Loading…" `<pre>` first, to exercise polling);
 *   - `/`: a tiny "gomail-like" single-page app: inbox, Compose (To, Subject, Body, Send); Send stores the
 *     email in the persisted state and shows "Message sent".
 * The /finish JSON has the shape the v2 gomail eval scripts read: `initialfinaldiff.{added,updated,deleted}`
 * (arrays keyed by index strings) and `differences.emails.{added,updated,deleted}` (lists of email objects
 * with `to`/`cc`/`bcc` lists, `subject`, `content`, `sent`, `draft`, `spam`, `trash`, `isRead`...), plus
 * `actionhistory`, `initialstate`, `finalstate`, `state`, `ui.snackbar.message`.
 * A second server on another port is the "external" origin for the navigation-blocking tests.
 * Switches make it differ from what a lenient harness gets away with (each a difference from agisdk's harness
 * that test/integration/real-scoring.test.ts shows): a /finish that renders or loads slowly, a Send behind
 * `confirm()`, a To field that opens with a value, an undo-send outbox that a second tab's boot writes back, and a
 * recipient picker that opens in a new window and fills the opener's To field.
 */

export interface FakeRequest {
  method: string;
  /** Raw request target, e.g. `/config?run_id=...` (a `//config` here would be the trailing-slash bug). */
  url: string;
  path: string;
  query: Record<string, string>;
}

export interface FakeRealSite {
  /** e.g. http://127.0.0.1:41234 */
  origin: string;
  /** A different origin (own server) with `/help` and a POST `/post` target. */
  externalOrigin: string;
  /** Every request to the site (not the external one), in order. */
  requests: FakeRequest[];
  /** Requests that reached the external origin (a blocked navigation never gets here). */
  externalRequests: FakeRequest[];
  /** Delay before /finish writes the JSON into its `<pre>` (the page first shows `Loading…`). */
  finishDelayMs: number;
  /**
   * Keep a counter (the `#bump` button) only in the agent page's scripts and report it in /finish as
   * `memory.bumps`: state that no storage copy carries.
   */
  memoryState: boolean;
  /** Added before every answer of the site (a hosted clone's round trip). */
  latencyMs: number;
  /** Lines of text the agent page shows above the mail (set as text, never parsed as HTML): page text a test controls. */
  notices: string[];
  /** A "Search mail" text field in the header of the agent page (it searches nothing): a field to type into. */
  searchBox: boolean;
  /**
   * Send asks `confirm("Send this message?")` first and sends only if it is answered OK: an action that a
   * harness dismissing dialogs (agisdk) never completes.
   */
  confirmSend: boolean;
  /** The value the composer's To field opens with (a suggested recipient): typing after it is a wrong address. */
  composeTo: string;
  /** Added before the /finish page's answer only: a /finish that loads slowly while the rest of the site is fast. */
  finishLatencyMs: number;
  /**
   * Undo send, in a persisted-state app: Send puts the message in an outbox, and the agent's tab delivers it
   * this many ms later, working on the persisted state (a store synced across tabs). The app booting meanwhile in
   * a second tab (/finish) returns outbox messages to drafts and writes its state back, so a read of /finish
   * during the window changes what the eval judges. 0: sent at once.
   */
  outboxMs: number;
  /**
   * The composer has a "Pick recipient" button that opens `/contacts` in a new window (window.open); picking a
   * contact there fills the opener's To field and closes the window. A harness that follows the popup in the
   * agent page instead of keeping both tabs has no opener to fill.
   */
  contactPicker: boolean;
  /** Requests for one path. */
  hits(path: string): FakeRequest[];
  close(): Promise<void>;
}

const STORAGE_KEY = 'fake-gomail-state';

/** Client-side code shared by the pages: state, persistence, the diff that /finish renders. */
const COMMON_JS = String.raw`
var STORAGE_KEY = ${JSON.stringify(STORAGE_KEY)};
function seedState() {
  var mk = function (id, from, subject, content, ts, extra) {
    var e = { id: id, from: from, to: ['me@gomail.test'], cc: [], bcc: [], subject: subject, content: content,
      timestamp: ts, isRead: false, starred: false, sent: false, draft: false, spam: false, trash: false,
      archived: false, labels: ['inbox'] };
    for (var k in extra) e[k] = extra[k];
    return e;
  };
  return {
    user: { name: 'Test User', email: 'me@gomail.test' },
    email: {
      emails: [
        mk(1, 'news@shop.test', 'Your weekly picks', 'New arrivals you might like.', '2024-07-18T08:00:00Z', {}),
        mk(2, 'dana.lee@example.com', 'Lunch on Friday?', 'Are you free for lunch this Friday?', '2024-07-17T12:30:00Z', { starred: true }),
        mk(3, 'no-reply@bank.test', 'Statement available', 'Your monthly statement is ready.', '2024-07-15T06:00:00Z', { isRead: true }),
        mk(4, 'sam.ortiz@example.com', 'Slides for review', 'Could you look at the attached slides?', '2024-07-12T16:45:00Z', {})
      ],
      labels: ['inbox', 'starred', 'sent', 'trash']
    },
    ui: { snackbar: { open: false, message: '' } }
  };
}
function loadStore() {
  try { var s = JSON.parse(localStorage.getItem(STORAGE_KEY)); if (s && s.current) return s; } catch (e) {}
  var seed = seedState();
  var s = { config: null, initial: seed, current: JSON.parse(JSON.stringify(seed)), actionhistory: [] };
  localStorage.setItem(STORAGE_KEY, JSON.stringify(s));
  return s;
}
function saveStore(s) { localStorage.setItem(STORAGE_KEY, JSON.stringify(s)); }
function record(s, type, payload) {
  s.actionhistory.push({ type: type, payload: payload, timestamp: Date.now(), index: s.actionhistory.length });
}
function isObj(v) { return v !== null && typeof v === 'object'; }
function same(a, b) { return JSON.stringify(a) === JSON.stringify(b); }
// Nested partial diff; arrays are compared like objects keyed by index strings.
function deepDiff(a, b) {
  var out = { added: {}, updated: {}, deleted: {} };
  var k;
  for (k in b) {
    if (!Object.prototype.hasOwnProperty.call(b, k)) continue;
    if (!isObj(a) || !Object.prototype.hasOwnProperty.call(a, k)) { out.added[k] = b[k]; continue; }
    if (isObj(a[k]) && isObj(b[k])) {
      var sub = deepDiff(a[k], b[k]);
      if (Object.keys(sub.added).length) out.added[k] = sub.added;
      if (Object.keys(sub.updated).length) out.updated[k] = sub.updated;
      if (Object.keys(sub.deleted).length) out.deleted[k] = sub.deleted;
    } else if (!same(a[k], b[k])) {
      out.updated[k] = b[k];
    }
  }
  for (k in a) {
    if (Object.prototype.hasOwnProperty.call(a, k) && (!isObj(b) || !Object.prototype.hasOwnProperty.call(b, k))) out.deleted[k] = a[k];
  }
  return out;
}
function emailDifferences(initial, final) {
  var before = {}, after = {}, res = { added: [], updated: [], deleted: [] };
  initial.email.emails.forEach(function (e) { before[e.id] = e; });
  final.email.emails.forEach(function (e) { after[e.id] = e; });
  final.email.emails.forEach(function (e) {
    if (!before[e.id]) res.added.push(e);
    else if (!same(before[e.id], e)) res.updated.push(e);
  });
  initial.email.emails.forEach(function (e) { if (!after[e.id]) res.deleted.push(e); });
  return res;
}
function finishJson(s) {
  return {
    actionhistory: s.actionhistory,
    initialstate: s.initial,
    finalstate: s.current,
    state: { config: s.config, email: s.current.email, ui: s.current.ui, user: s.current.user, _persist: { version: 1, rehydrated: true } },
    initialfinaldiff: deepDiff(s.initial, s.current),
    differences: { emails: emailDifferences(s.initial, s.current) }
  };
}
`;

const CONFIG_JS = String.raw`
var q = new URLSearchParams(location.search);
var seed = seedState();
var store = {
  config: { run_id: q.get('run_id'), task_id: q.get('task_id'), latency: Number(q.get('latency') || 0) },
  initial: seed,
  current: JSON.parse(JSON.stringify(seed)),
  actionhistory: []
};
record(store, 'config/setConfig', store.config);
saveStore(store);
document.getElementById('status').textContent = 'Configured ' + store.config.task_id;
`;

const FINISH_JS = String.raw`
// Booted in a second tab, the app owns no composer: a message still in the outbox goes back to drafts, and the
// rehydrated state is written back, as redux-persist does after every rehydration.
function recoverOutbox(s) {
  var moved = 0;
  s.current.email.emails.forEach(function (e) { if (e.outbox) { e.outbox = false; e.draft = true; e.labels = ['drafts']; moved++; } });
  if (moved) record(s, 'email/recoverOutbox', { count: moved });
  saveStore(s);
}
setTimeout(function () {
  var s = loadStore();
  if (window.__OUTBOX_MS > 0) recoverOutbox(s);
  var out = finishJson(s);
  if (!window.__MEMORY_STATE) {
    document.getElementById('finish').textContent = JSON.stringify(out, null, 2);
    return;
  }
  // Memory mode: part of the state lives only in the agent page's scripts; ask it over a channel.
  var bumps = 0;
  var ch = new BroadcastChannel('fake-gomail-memory');
  ch.onmessage = function (m) { if (m.data && typeof m.data.bumps === 'number') bumps = Math.max(bumps, m.data.bumps); };
  ch.postMessage('ask');
  setTimeout(function () {
    ch.close();
    out.memory = { bumps: bumps };
    document.getElementById('finish').textContent = JSON.stringify(out, null, 2);
  }, 300);
}, window.__FINISH_DELAY_MS || 0);
`;

const APP_JS = String.raw`
var store = loadStore();
var composing = false;
var folder = new URLSearchParams(location.search).get('folder') || 'inbox';
function el(tag, attrs, children) {
  var e = document.createElement(tag);
  for (var k in attrs) { if (k === 'text') e.textContent = attrs[k]; else e.setAttribute(k, attrs[k]); }
  (children || []).forEach(function (c) { e.appendChild(c); });
  return e;
}
// Delivery reads the persisted state, as a store synced across tabs does: what another tab wrote counts.
function deliver(id) {
  store = loadStore();
  var e = store.current.email.emails.filter(function (x) { return x.id === id; })[0];
  if (e && e.outbox) {
    e.outbox = false; e.sent = true; e.labels = ['sent'];
    store.current.ui.snackbar = { open: true, message: 'Message sent' };
    record(store, 'email/deliver', { id: id });
    saveStore(store);
  }
  render();
}
function render() {
  var main = document.getElementById('app');
  main.innerHTML = '';
  var s = store.current;
  main.appendChild(el('h2', { text: folder === 'sent' ? 'Sent' : 'Inbox' }));
  if (s.ui.snackbar.open) main.appendChild(el('div', { role: 'status', id: 'snackbar', text: s.ui.snackbar.message }));
  if (!composing) {
    var compose = el('button', { id: 'compose', text: 'Compose' });
    compose.addEventListener('click', function () { composing = true; render(); });
    main.appendChild(compose);
  } else {
    var form = el('form', { id: 'compose-form' }, [
      el('label', {}, [document.createTextNode('To '), el('input', { name: 'to', id: 'to' })]),
      el('label', {}, [document.createTextNode('Subject '), el('input', { name: 'subject', id: 'subject' })]),
      el('label', {}, [document.createTextNode('Body '), el('textarea', { name: 'body', id: 'body', rows: '4' })]),
      el('button', { type: 'submit', id: 'send', text: 'Send' })
    ]);
    if (window.__CONTACT_PICKER) {
      var pick = el('button', { type: 'button', id: 'pick', text: 'Pick recipient' });
      pick.addEventListener('click', function () { window.open('/contacts', '_blank'); });
      form.insertBefore(pick, form.firstChild.nextSibling);
    }
    // The unsent draft lives in the tab's sessionStorage, as some clones keep per-tab UI state.
    var draft = {};
    try { draft = JSON.parse(sessionStorage.getItem('fake-gomail-draft')) || {}; } catch (e) {}
    ['to', 'subject', 'body'].forEach(function (k) {
      if (draft[k]) form[k].value = draft[k];
      form[k].addEventListener('input', function () {
        draft[k] = form[k].value;
        sessionStorage.setItem('fake-gomail-draft', JSON.stringify(draft));
      });
    });
    if (window.__COMPOSE_TO && !draft.to) form.to.value = window.__COMPOSE_TO;
    form.addEventListener('submit', function (ev) {
      ev.preventDefault();
      if (window.__CONFIRM_SEND && !window.confirm('Send this message?')) return;
      var ids = s.email.emails.map(function (e) { return e.id; });
      var email = {
        id: Math.max.apply(null, ids.concat([0])) + 1,
        from: s.user.email,
        to: form.to.value.split(',').map(function (x) { return x.trim(); }).filter(Boolean),
        cc: [], bcc: [],
        subject: form.subject.value,
        content: form.body.value,
        timestamp: '2024-07-18T10:00:00Z',
        isRead: true, starred: false, sent: true, draft: false, spam: false, trash: false, archived: false,
        labels: ['sent']
      };
      var undo = window.__OUTBOX_MS > 0;
      if (undo) { email.sent = false; email.outbox = true; email.labels = ['outbox']; }
      s.email.emails.push(email);
      s.ui.snackbar = { open: true, message: undo ? 'Sending… Undo' : 'Message sent' };
      record(store, 'email/sendEmail', { id: email.id });
      saveStore(store);
      composing = false;
      render();
      if (undo) setTimeout(function () { deliver(email.id); }, window.__OUTBOX_MS);
    });
    main.appendChild(form);
  }
  var list = el('ul', { id: 'mail-list' });
  s.email.emails.forEach(function (e) {
    if (e.trash || (folder === 'sent') !== e.sent) return;
    list.appendChild(el('li', { text: (folder === 'sent' ? e.to.join(', ') : e.from) + ' - ' + e.subject }));
  });
  main.appendChild(list);
}
// Called by the /contacts window this page opened.
window.pickRecipient = function (address) {
  var to = document.getElementById('to');
  if (!to) return;
  to.value = address;
  to.dispatchEvent(new Event('input'));
};
if (window.__MEMORY_STATE) {
  var bumps = 0;
  var memory = new BroadcastChannel('fake-gomail-memory');
  memory.onmessage = function (m) { if (m.data === 'ask') memory.postMessage({ bumps: bumps }); };
  var bump = el('button', { id: 'bump', type: 'button', text: 'Bump counter' });
  bump.addEventListener('click', function () { bumps++; bump.textContent = 'Bump counter (' + bumps + ')'; });
  document.querySelector('header').appendChild(bump);
}
if (window.__NOTICES.length) {
  var notices = el('ul', { id: 'notices' });
  window.__NOTICES.forEach(function (n) { notices.appendChild(el('li', { text: n })); });
  document.querySelector('header').appendChild(notices);
}
if (window.__SEARCH_BOX) document.querySelector('header').appendChild(el('input', { id: 'search', 'aria-label': 'Search mail' }));
document.getElementById('popup').addEventListener('click', function () { window.open(window.__EXTERNAL + '/help', '_blank'); });
document.getElementById('popup-local').addEventListener('click', function () { window.open('/?folder=sent', '_blank'); });
render();
`;

const CONTACTS_JS = String.raw`
var status = document.getElementById('status');
['alice.wong@example.com', 'brian.king@example.com'].forEach(function (address) {
  var b = document.createElement('button');
  b.type = 'button';
  b.textContent = address;
  b.addEventListener('click', function () {
    if (!window.opener || typeof window.opener.pickRecipient !== 'function') {
      status.textContent = 'No message is being composed';
      return;
    }
    window.opener.pickRecipient(address);
    // A picker closes itself once it has answered (after the click has returned).
    setTimeout(function () { window.close(); }, 100);
  });
  document.getElementById('contacts').appendChild(b);
});
`;

function page(title: string, body: string, scripts: string[]): string {
  return `<!doctype html><html><head><meta charset="utf-8"><title>${title}</title>
<style>body{font:16px sans-serif;margin:16px} header a,header button{margin-right:12px} label{display:block;margin:6px 0} #snackbar{background:#333;color:#fff;padding:6px}</style>
</head><body>${body}${scripts.map((s) => `<script>${s}</script>`).join('')}</body></html>`;
}

function parseTarget(raw: string): { path: string; query: Record<string, string> } {
  const u = new URL(raw, 'http://x');
  return { path: raw.startsWith('//') ? raw.split('?')[0] : u.pathname, query: Object.fromEntries(u.searchParams) };
}

function sendHtml(res: ServerResponse, html: string, status = 200): void {
  res.writeHead(status, { 'Content-Type': 'text/html; charset=utf-8', 'Cache-Control': 'no-store', 'Content-Length': Buffer.byteLength(html) });
  res.end(html);
}

function listen(server: Server): Promise<string> {
  return new Promise((ok, fail) => {
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => {
      server.off('error', fail);
      ok(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    });
  });
}

function closeServer(server: Server): Promise<void> {
  return new Promise((ok) => {
    server.close(() => ok());
    server.closeAllConnections();
  });
}

export async function startFakeRealSite(
  opts: {
    finishDelayMs?: number;
    memoryState?: boolean;
    latencyMs?: number;
    notices?: string[];
    searchBox?: boolean;
    confirmSend?: boolean;
    composeTo?: string;
    finishLatencyMs?: number;
    outboxMs?: number;
    contactPicker?: boolean;
    /** Serve `/bounce?to=<url>`: a 302 to any URL (the egress tests' open redirect). */
    openRedirect?: boolean;
  } = {},
): Promise<FakeRealSite> {
  const requests: FakeRequest[] = [];
  const externalRequests: FakeRequest[] = [];

  const external = createServer((req: IncomingMessage, res: ServerResponse) => {
    const raw = req.url ?? '/';
    externalRequests.push({ method: req.method ?? 'GET', url: raw, ...parseTarget(raw) });
    req.resume();
    sendHtml(res, page('External site', '<h1>External help site</h1><p>You left the task site.</p>', []));
  });
  const externalOrigin = await listen(external);

  const site: FakeRealSite = {
    origin: '',
    externalOrigin,
    requests,
    externalRequests,
    finishDelayMs: opts.finishDelayMs ?? 0,
    memoryState: opts.memoryState ?? false,
    latencyMs: opts.latencyMs ?? 0,
    notices: opts.notices ?? [],
    searchBox: opts.searchBox ?? false,
    confirmSend: opts.confirmSend ?? false,
    composeTo: opts.composeTo ?? '',
    finishLatencyMs: opts.finishLatencyMs ?? 0,
    outboxMs: opts.outboxMs ?? 0,
    contactPicker: opts.contactPicker ?? false,
    hits: (path: string) => requests.filter((r) => r.path === path),
    close: async () => {
      await closeServer(server);
      await closeServer(external);
    },
  };

  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const raw = req.url ?? '/';
    const { path, query } = parseTarget(raw);
    requests.push({ method: req.method ?? 'GET', url: raw, path, query });
    req.resume();
    const wait = site.latencyMs + (path === '/finish' ? site.finishLatencyMs : 0);
    if (wait > 0) setTimeout(() => answer(req, res, path), wait);
    else answer(req, res, path);
  });

  const answer = (req: IncomingMessage, res: ServerResponse, path: string): void => {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      sendHtml(res, page('Not allowed', '<p>method not allowed</p>', []), 405);
      return;
    }
    if (path === '/favicon.ico') {
      res.writeHead(404).end();
      return;
    }
    if (path === '/config') {
      sendHtml(res, page('Config', '<p id="status">Configuring…</p>', [COMMON_JS, CONFIG_JS]));
      return;
    }
    if (path === '/finish') {
      const delay = `window.__FINISH_DELAY_MS = ${JSON.stringify(site.finishDelayMs)}; window.__MEMORY_STATE = ${JSON.stringify(site.memoryState)}; window.__OUTBOX_MS = ${JSON.stringify(site.outboxMs)};`;
      sendHtml(res, page('Finish', '<pre id="finish">Loading state…</pre>', [delay, COMMON_JS, FINISH_JS]));
      return;
    }
    if (opts.openRedirect && path === '/bounce') {
      const to = new URL(req.url ?? '/', 'http://x').searchParams.get('to') ?? '/';
      res.writeHead(302, { Location: to, 'Content-Length': 0 });
      res.end();
      return;
    }
    if (path === '/go-out') {
      // A same-origin link that redirects off the site.
      res.writeHead(302, { Location: `${externalOrigin}/help`, 'Content-Length': 0 });
      res.end();
      return;
    }
    if (path === '/contacts') {
      sendHtml(res, page('Contacts', '<h1>Contacts</h1><p id="status" role="status"></p><div id="contacts"></div>', [CONTACTS_JS]));
      return;
    }
    if (path === '/' || path === '/inbox') {
      const header = `<header>
<h1>GoMail test double</h1>
<a id="help-link" href="${externalOrigin}/help">Help center</a>
<a id="sent-link" href="/?folder=sent">Sent mail</a>
<a id="status-link" href="/go-out">Service status</a>
<button id="popup" type="button">Open help in a new window</button>
<button id="popup-local" type="button">Open sent mail in a new window</button>
<form id="report-form" method="post" action="${externalOrigin}/post" style="display:inline"><button id="report" type="submit">Report a problem</button></form>
</header><main id="app"></main>`;
      const memory = `window.__MEMORY_STATE = ${JSON.stringify(site.memoryState)};`;
      // `<` escaped: a notice may spell `</script>`.
      const extras =
        `window.__NOTICES = ${JSON.stringify(site.notices).replace(/</g, '\\u003c')}; window.__SEARCH_BOX = ${JSON.stringify(site.searchBox)}; ` +
        `window.__CONFIRM_SEND = ${JSON.stringify(site.confirmSend)}; window.__OUTBOX_MS = ${JSON.stringify(site.outboxMs)}; window.__COMPOSE_TO = ${JSON.stringify(site.composeTo).replace(/</g, '\\u003c')}; window.__CONTACT_PICKER = ${JSON.stringify(site.contactPicker)};`;
      sendHtml(res, page('GoMail test double', header, [`window.__EXTERNAL = ${JSON.stringify(externalOrigin)};`, memory, extras, COMMON_JS, APP_JS]));
      return;
    }
    sendHtml(res, page('Not found', '<p>not found</p>', []), 404);
  };
  site.origin = await listen(server);
  return site;
}
