// GoCalendar (Google Calendar clone) milestones: open the event editor → title → date/time → Save → created.
//
// Client-state evidence (REAL `/finish` JSON, the structure the v2 gocalendar verifiers read):
//   - new events: `differences.events.added` (id → event with `title`, `start`, `end` as ISO strings,
//     `allDay`, `location`, `description`);
//   - new tasks/reminders: `initialfinaldiff.added.calendar.myTasks` (and `myEvents`), same item shape.
// A new event proves the editor was opened and saved (and its title was entered when it has one), so
// those milestones fire with it if the page never showed them.

import {
  defineDetector,
  describeNode,
  FIELD_ROLES,
  findNode,
  getPath,
  hasFlag,
  isEnabled,
  isRecord,
  itemsOf,
  MESSAGE_ROLES,
  nonEmpty,
  oneLine,
  quote,
  str,
  type AxNode,
  type MilestoneDetector,
  type Page,
} from '../milestones';

const MAX_EVENTS = 500;

function looksLikeEvent(e: unknown): e is Record<string, unknown> {
  return isRecord(e) && ('title' in e || 'start' in e || 'startTime' in e);
}

/** Events and tasks this episode created. */
function createdEvents(state: unknown): Array<Record<string, unknown>> {
  const out: Array<Record<string, unknown>> = [];
  const sources: string[][] = [
    ['differences', 'events', 'added'],
    ['initialfinaldiff', 'added', 'calendar', 'myTasks'],
    ['initialfinaldiff', 'added', 'calendar', 'myEvents'],
  ];
  for (const path of sources) {
    for (const e of itemsOf(getPath(state, path))) {
      if (looksLikeEvent(e)) out.push(e);
      if (out.length >= MAX_EVENTS) return out;
    }
  }
  return out;
}

function describeEvent(e: Record<string, unknown>): string {
  const start = str(e.start) || str(e.startTime);
  return `title ${quote(str(e.title))}${start ? ` start ${oneLine(start, 30)}` : ''}${e.allDay === true ? ' all-day' : ''}`;
}

const meaningfulTitle = (s: string): boolean => nonEmpty(s) && !/^\(?no title\)?$/i.test(s.trim());

// The event editor: its title ("Create event", "New event", "Event details"), or the event's title field.
const EDITOR_TITLE = /^((create|new|add|edit)\s+(an?\s+|new\s+)?(event|task|reminder|appointment)|(event|task)\s+details)$/i;
const EDITOR_ROLES = new Set(['dialog', 'alertdialog', 'heading', 'region', 'form', 'group']);
const TITLE_FIELD = /^(add\s+(a\s+)?title\b|title\b|(event|task|reminder)\s+(title|name)\b)/i;
const EDITOR_URL = /\/(events?|tasks?|reminders?)\/(new|create|edit)\b|\/(create|new)[-_]?(event|task|reminder)\b/i;
const SAVE_BUTTON = /^(save|save\s+(event|task|reminder|changes)|create|create\s+(event|task)|add|add\s+(event|task)|done|schedule)$/i;
// A whole toast line: "Event created", "Task saved", "Your event was added".
const CREATED_TOAST = /^(your\s+)?(new\s+)?(event|task|reminder|appointment)\s+(was\s+|has\s+been\s+)?(created|saved|added|scheduled)\.?(\s+undo)?$/i;
const ERROR_MESSAGE = /\b(required|invalid|error|please\s+(enter|add|select|choose))\b/i;

// Date/time controls: named like a date or time, or holding a date/time value; never the title/notes fields.
const DATE_NAME = /\b(date|time|start|end|from|until|to|when|day|hour|minute|repeat|recurrence)\b/i;
const NOT_DATE_NAME = /\b(title|description|location|notes?|guests?|subject|search|attendees?|e-?mail|meeting link)\b/i;
const DATE_VALUE =
  /\b\d{1,2}:\d{2}\b|\b\d{1,2}\s*(am|pm)\b|\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}\/\d{1,2}\/\d{2,4}\b|\b(jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?\s+\d{1,2}\b|\b(mon|tues?|wed|thu|thur|fri|sat|sun)(day|nesday|rsday|urday)?\b/i;
const DATE_TYPES = /^(date|time|datetime|datetime-local|month|week)$/i;

function editorUi(p: Page): string | null {
  const t = findNode(p, (n) => EDITOR_ROLES.has(n.role) && EDITOR_TITLE.test(n.name.trim()));
  if (t) return describeNode(t);
  const f = findNode(p, (n) => FIELD_ROLES.has(n.role) && TITLE_FIELD.test(n.name.trim()));
  if (f) return describeNode(f);
  if (p.web && EDITOR_URL.test(p.parts.path)) return `url path ${oneLine(p.parts.path, 80)}`;
  return null;
}

function titleField(p: Page): AxNode | undefined {
  return findNode(p, (n) => FIELD_ROLES.has(n.role) && TITLE_FIELD.test(n.name.trim()));
}

function isDateControl(n: AxNode): boolean {
  if (n.value === null || NOT_DATE_NAME.test(n.name)) return false;
  if (!FIELD_ROLES.has(n.role) && n.role !== 'slider') return false;
  return DATE_NAME.test(n.name) || DATE_TYPES.test(n.props.type ?? '') || DATE_VALUE.test(n.value);
}

/** Values of the date/time controls by `role|name` (several controls may share a name: kept in order). */
function dateControls(p: Page): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const n of p.nodes) {
    if (!isDateControl(n)) continue;
    const key = `${n.role}|${n.name.trim().toLowerCase()}`;
    const list = out.get(key) ?? [];
    list.push((n.value ?? '').trim());
    out.set(key, list);
  }
  return out;
}

const ALL_DAY = /^all[\s-]?day\b/i;

function createdToast(p: Page): AxNode | undefined {
  return findNode(p, (n) => (MESSAGE_ROLES.has(n.role) || n.role === 'alertdialog') && CREATED_TOAST.test(n.name.trim()));
}

function countMentions(p: Page, text: string): number {
  const t = text.toLowerCase();
  let c = 0;
  for (const n of p.nodes) if (!FIELD_ROLES.has(n.role) && n.name.toLowerCase().includes(t)) c++;
  return c;
}

export const gocalendarMilestones: MilestoneDetector[] = [
  // The event editor is open: a dialog/heading "Create event" / "New event" / "Event details", or a
  // title field ("Add title"), or an editor URL (`/events/new`); state: an event or task this episode created.
  // The "Create" button of the main view alone is not evidence.
  defineDetector('create_event_clicked', 'editor dialog/heading "Create event", or textbox "Add title", or /events/new; state: a created event/task', (view) => {
    const ui = editorUi(view);
    if (ui) return ui;
    const e = createdEvents(view.state)[0];
    return e ? `state: created event ${describeEvent(e)}` : null;
  }),

  // The editor's title field holds a non-empty value; state: a created event/task with a title.
  defineDetector('title_entered', 'textbox "Add title"/"Title" with a non-empty value; state: a created event with a title', (view) => {
    const f = titleField(view);
    if (f && nonEmpty(f.value)) return describeNode(f);
    const e = createdEvents(view.state).find((x) => meaningfulTitle(str(x.title)));
    return e ? `state: created event ${describeEvent(e)}` : null;
  }),

  // The editor is open before and after the action and a date/time control (named Date/Start/End/Time...,
  // or type=date/time, or holding a date/time value) changed value, or the "All day" checkbox became
  // checked; state: a created all-day event. Opening the editor (default date shown) is not evidence.
  defineDetector('datetime_set', 'date/time field value changed while the editor is open, or "All day" checked; state: a created all-day event', (view, prev) => {
    if (editorUi(view) && editorUi(prev)) {
      const before = dateControls(prev);
      for (const [key, values] of dateControls(view)) {
        const old = before.get(key);
        if (!old) continue;
        const i = values.findIndex((v, k) => k < old.length && v !== old[k] && nonEmpty(v));
        if (i >= 0) return `${key.replace('|', ' ')} ${quote(old[i] ?? '')} → ${quote(values[i])}`;
      }
      const allDay = findNode(view, (n) => (n.role === 'checkbox' || n.role === 'switch') && ALL_DAY.test(n.name) && hasFlag(n, 'checked'));
      if (allDay) {
        const was = findNode(prev, (n) => (n.role === 'checkbox' || n.role === 'switch') && ALL_DAY.test(n.name) && hasFlag(n, 'checked'));
        if (!was) return describeNode(allDay);
      }
    }
    const e = createdEvents(view.state).find((x) => x.allDay === true);
    return e ? `state: created event ${describeEvent(e)}` : null;
  }),

  // The editor (with an enabled Save button) was open before the action and is closed after it, with no
  // error message, and the result shows: the entered title now appears on the page more often than before,
  // or a "Event created" toast; state: a created event/task. Cancel closes the editor without either.
  defineDetector('save_clicked', 'editor with Save open before and closed after, and the title now shown or a "created" toast; state: a created event', (view, prev) => {
    const e = createdEvents(view.state)[0];
    if (e) return `state: created event ${describeEvent(e)}`;
    const save = findNode(prev, (n) => n.role === 'button' && SAVE_BUTTON.test(n.name.trim()) && isEnabled(n));
    if (!save || !editorUi(prev) || editorUi(view)) return null;
    if (findNode(view, (n) => (n.role === 'alert' || n.role === 'status') && ERROR_MESSAGE.test(n.name))) return null;
    const toast = createdToast(view);
    if (toast) return `${describeNode(save)} then ${describeNode(toast)}`;
    const title = (titleField(prev)?.value ?? '').trim();
    if (title.length >= 2 && countMentions(view, title) > countMentions(prev, title)) {
      return `${describeNode(save)} then ${quote(title)} shown on the calendar`;
    }
    return null;
  }),

  // State: `differences.events.added` (or `initialfinaldiff.added.calendar.myTasks`/`myEvents`) has an
  // event/task; page: a whole toast line "Event created" / "Task saved".
  defineDetector('event_created', 'state: differences.events.added / calendar.myTasks entry; page: toast "Event created"', (view) => {
    const e = createdEvents(view.state)[0];
    if (e) return `state: created event ${describeEvent(e)}`;
    const toast = createdToast(view);
    return toast ? describeNode(toast) : null;
  }),
];
