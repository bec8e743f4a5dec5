import { z } from 'zod';

// Coordinates live on Qwen3-VL's 0-1000 grid, independent of the screenshot size.
export const GRID_MAX = 1000;

/** The `action` values of the computer_use tool, as the model writes them (lib/model-io/prompt.ts describes each). */
export const TOOL_ACTIONS = ['left_click', 'double_click', 'right_click', 'mouse_move', 'click_element', 'type', 'key', 'scroll', 'wait', 'answer'] as const;
export type ToolAction = (typeof TOOL_ACTIONS)[number];
const coord = z.number().finite().min(0).max(GRID_MAX);

export const clickAction = z.object({
  type: z.literal('click'),
  x: coord,
  y: coord,
  button: z.enum(['left', 'right', 'middle']).default('left'),
  count: z.number().int().min(1).max(3).default(1),
});
export const doubleClickAction = z.object({ type: z.literal('double_click'), x: coord, y: coord });
export const moveAction = z.object({ type: z.literal('move'), x: coord, y: coord });
export const clickElementAction = z.object({ type: z.literal('click_element'), id: z.number().int().min(0) });
export const typeAction = z.object({
  type: z.literal('type'),
  text: z.string().max(2000),
  // Optional element to focus first; without it the text goes to the focused element.
  id: z.number().int().min(0).optional(),
});
export const keyAction = z.object({ type: z.literal('key'), keys: z.array(z.string().min(1).max(32)).min(1).max(6) });
export const scrollAction = z.object({
  type: z.literal('scroll'),
  direction: z.enum(['up', 'down', 'left', 'right']),
  amount: z.number().int().min(1).max(5000).default(300),
  x: coord.optional(),
  y: coord.optional(),
});
export const gotoAction = z.object({ type: z.literal('goto'), url: z.string().min(1).max(2048) });
export const waitAction = z.object({ type: z.literal('wait'), seconds: z.number().min(0).max(30).default(1) });
// Terminal: the agent's final message (REAL's send-message, Qwen's answer/terminate).
export const answerAction = z.object({ type: z.literal('answer'), text: z.string().max(4000) });

export const actionSchema = z.discriminatedUnion('type', [
  clickAction,
  doubleClickAction,
  moveAction,
  clickElementAction,
  typeAction,
  keyAction,
  scrollAction,
  gotoAction,
  waitAction,
  answerAction,
]);
export type Action = z.infer<typeof actionSchema>;
export type ActionType = Action['type'];

// Malformed model output is data, not an exception: it becomes this and is counted in action validity.
export interface InvalidAction {
  type: 'invalid';
  reason: string;
  excerpt: string;
}
export type AgentAction = Action | InvalidAction;

export function isValidAction(a: AgentAction): a is Action {
  return a.type !== 'invalid';
}

export function isTerminal(a: AgentAction): boolean {
  return a.type === 'answer';
}

/** One-line human text for logs and the Temporal UI. */
export function describeAction(a: AgentAction): string {
  switch (a.type) {
    case 'click':
      return `${a.count === 2 ? 'double ' : a.count === 3 ? 'triple ' : ''}${a.button === 'left' ? '' : a.button + ' '}click (${a.x}, ${a.y})`;
    case 'double_click':
      return `double click (${a.x}, ${a.y})`;
    case 'move':
      return `move (${a.x}, ${a.y})`;
    case 'click_element':
      return `click element [${a.id}]`;
    case 'type':
      return `type ${JSON.stringify(clip(a.text, 60))}${a.id === undefined ? '' : ` into [${a.id}]`}`;
    case 'key':
      return `key ${a.keys.join('+')}`;
    case 'scroll':
      return `scroll ${a.direction} ${a.amount}px`;
    case 'goto':
      return `goto ${clip(a.url, 80)}`;
    case 'wait':
      return `wait ${a.seconds}s`;
    case 'answer':
      return `answer ${JSON.stringify(clip(a.text, 60))}`;
    case 'invalid':
      return `invalid: ${clip(a.reason, 80)}`;
  }
}

export function clip(s: string, n: number): string {
  return s.length <= n ? s : s.slice(0, n - 1) + '…';
}

/** Canonical text of an action (keys in a fixed order), so equal actions compare equal. */
export function actionKey(a: Action): string {
  return JSON.stringify(a, Object.keys(a).sort());
}
