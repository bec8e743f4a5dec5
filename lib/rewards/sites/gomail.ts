// GoMail (Gmail clone) milestones: compose → recipient → subject → Send → sent.
//
// Client-state evidence (REAL `/finish` JSON, the structure the v2 gomail verifiers read):
//   - new emails: `differences.emails.added` (a list) and `initialfinaldiff.added.email.emails` (id → email);
//     replies sit in an email's `replies` list. An email has `to` (list or string), `subject`, `content`,
//     `sent` (true once sent), `draft`.
//   - toasts: `initialfinaldiff.{added,updated}.ui.snackbar.message`.
// A sent email also proves the earlier steps (compose was open, Send was there, and the recipient/subject
// when the email has them), so those fire with it if the page never showed them: every path to a sent
// email earns the same milestone total.

import {
  defineDetector,
  describeNode,
  FIELD_ROLES,
  findNode,
  getPath,
  isEnabled,
  isRecord,
  itemsOf,
  nonEmpty,
  changedSubtrees,
  oneLine,
  quote,
  strOrFirst,
  str,
  type AxNode,
  type MilestoneDetector,
  type Page,
} from '../milestones';

const MAX_EMAILS = 500;

/** Emails this episode added (new messages, drafts, replies), from both diff sections. */
function addedEmails(state: unknown): Array<Record<string, unknown>> {
  const out: Array<Record<string, unknown>> = [];
  const push = (e: unknown, depth: number): void => {
    if (!isRecord(e) || out.length >= MAX_EMAILS) return;
    out.push(e);
    if (depth < 2) for (const r of itemsOf(e.replies)) push(r, depth + 1);
  };
  for (const e of itemsOf(getPath(state, ['differences', 'emails', 'added']))) push(e, 0);
  for (const e of itemsOf(getPath(state, ['initialfinaldiff', 'added', 'email', 'emails']))) push(e, 0);
  return out;
}

function isSent(e: Record<string, unknown>): boolean {
  return e.sent === true && e.draft !== true;
}

function firstSent(state: unknown): Record<string, unknown> | undefined {
  return addedEmails(state).find(isSent);
}

function describeEmail(e: Record<string, unknown>): string {
  return `to ${quote(strOrFirst(e.to))} subject ${quote(str(e.subject))}`;
}

const meaningfulSubject = (s: string): boolean => nonEmpty(s) && s.trim().toLowerCase() !== 'no subject';

// Compose window title (dialog, heading or plain text); a bare "Compose" is the button that opens it.
const COMPOSE_TITLE = /^(new\s+(message|mail|email)|compose\s+(mail|email|message))$/i;
const TITLE_ROLES = new Set(['dialog', 'alertdialog', 'heading', 'text', 'region', 'form', 'group']);
const TO_FIELD = /^(to\b|recipients?\b)/i;
const SUBJECT_FIELD = /^subject\b/i;
const SEND_BUTTON = /^send(\s+(email|message|mail|now))?\s*(\(.*\))?$/i;
// A whole toast line such as "Message sent" / "Your email has been sent. Undo": anchored, so inbox rows
// whose subject merely mentions a sent message do not count.
const SENT_TOAST = /^(your\s+)?(message|email|mail)\s+(has\s+been\s+|was\s+)?sent\.?(\s+(undo|view\s+message))*$/i;
const TOAST_ROLES = new Set(['alert', 'status', 'log', 'text', 'heading', 'alertdialog']);

const field = (p: Page, re: RegExp): AxNode | undefined => findNode(p, (n) => FIELD_ROLES.has(n.role) && re.test(n.name));

function composeUi(p: Page): string | null {
  const title = findNode(p, (n) => TITLE_ROLES.has(n.role) && COMPOSE_TITLE.test(n.name.trim()));
  if (title) return describeNode(title);
  const to = field(p, TO_FIELD);
  const subject = field(p, SUBJECT_FIELD);
  const send = findNode(p, (n) => n.role === 'button' && SEND_BUTTON.test(n.name.trim()));
  if (to && (subject || send)) return `${describeNode(to)} with ${describeNode((subject ?? send)!)}`;
  if (p.web) {
    if (/\/compose(\/|$)/i.test(p.parts.path)) return `url path ${oneLine(p.parts.path, 80)}`;
    const q = p.parts.query.find(([k]) => /^compose$/i.test(k));
    if (q) return `url ?${q[0]}=${oneLine(q[1], 40)}`;
    if (/[#?&/]compose\b/i.test(p.parts.hash)) return `url ${oneLine(p.parts.hash, 80)}`;
  }
  return null;
}

export const gomailMilestones: MilestoneDetector[] = [
  // A compose window: its title ("New Message"), or a To field next to a Subject field or a Send button,
  // or a compose URL (`/compose`, `?compose=new`, `#...compose`); state: any email this episode added
  // (draft or sent). The "Compose" button alone (always on the inbox) is not evidence.
  defineDetector('compose_opened', 'compose dialog/heading "New Message", or To field with Subject/Send, or compose URL; state: an added email', (view) => {
    const ui = composeUi(view);
    if (ui) return ui;
    const e = addedEmails(view.state).find((x) => isSent(x) || x.draft === true);
    return e ? `state: added ${isSent(e) ? 'sent' : 'draft'} email ${describeEmail(e)}` : null;
  }),

  // A To/Recipients text field with a non-empty value; state: an added email with a recipient.
  defineDetector('recipient_filled', 'textbox named To/Recipients with a non-empty value; state: an added email with a non-empty `to`', (view) => {
    const to = findNode(view, (n) => FIELD_ROLES.has(n.role) && TO_FIELD.test(n.name) && nonEmpty(n.value));
    if (to) return describeNode(to);
    const e = addedEmails(view.state).find((x) => nonEmpty(strOrFirst(x.to)));
    return e ? `state: added email ${describeEmail(e)}` : null;
  }),

  // A Subject text field with a non-empty value other than "No Subject" (the site's placeholder subject);
  // state: an added email with such a subject.
  defineDetector('subject_filled', 'textbox named Subject with a non-empty value (not "No Subject"); state: an added email with a subject', (view) => {
    const s = findNode(view, (n) => FIELD_ROLES.has(n.role) && SUBJECT_FIELD.test(n.name) && meaningfulSubject(n.value ?? ''));
    if (s) return describeNode(s);
    const e = addedEmails(view.state).find((x) => meaningfulSubject(str(x.subject)));
    return e ? `state: added email ${describeEmail(e)}` : null;
  }),

  // An enabled button named "Send" (not the "Sent" folder link, not "Send feedback"); state: a sent email.
  defineDetector('send_visible', 'enabled button "Send"; state: a sent email', (view) => {
    const b = findNode(view, (n) => n.role === 'button' && SEND_BUTTON.test(n.name.trim()) && isEnabled(n));
    if (b) return describeNode(b);
    const e = firstSent(view.state);
    return e ? `state: sent email ${describeEmail(e)}` : null;
  }),

  // State: an added email with `sent: true` (not a draft), or a snackbar message saying it was sent;
  // page: a toast line "Message sent" (whole line, alert/status/text).
  defineDetector('sent_confirmation', 'state: added email with sent=true, or snackbar "...sent"; page: toast "Message sent"', (view) => {
    const e = firstSent(view.state);
    if (e) return `state: sent email ${describeEmail(e)}`;
    for (const { section, tree } of changedSubtrees(view.state)) {
      const msg = getPath(tree, ['ui', 'snackbar', 'message']);
      if (typeof msg === 'string' && /\bsent\b/i.test(msg) && !/\b(not|un)\s*sent\b|fail|error/i.test(msg)) {
        return `state: ${section}.ui.snackbar.message ${quote(msg)}`;
      }
    }
    const toast = findNode(view, (n) => TOAST_ROLES.has(n.role) && SENT_TOAST.test(n.name.trim()));
    return toast ? describeNode(toast) : null;
  }),
];
