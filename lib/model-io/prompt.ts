import { GRID_MAX, TOOL_ACTIONS } from './actions';
import { neutraliseAddedTokens } from './prompt-text';

// One prompt builder for every policy backend (vLLM, colocated learner, OpenAI baseline), so a
// LoRA update sees exactly the prompt format the sampler saw.

export interface PromptObservation {
  goal: string;
  url: string;
  axtree: string;
  step: number;
  screenshotRef: string;
}

export interface HistoryEntry {
  step: number;
  action: string;
  note?: string;
}

export type PromptPart = { type: 'text'; text: string } | { type: 'image'; ref: string };
export interface PromptMessage {
  role: 'system' | 'user';
  content: PromptPart[];
}

export const COMPUTER_USE_TOOL = {
  type: 'function',
  function: {
    name: 'computer_use',
    description:
      `Use a mouse and keyboard to interact with a web page shown as a screenshot. Coordinates are on a ` +
      `${GRID_MAX}x${GRID_MAX} grid over the screenshot: (0, 0) is the top-left corner, (${GRID_MAX}, ${GRID_MAX}) the bottom-right.`,
    parameters: {
      type: 'object',
      required: ['action'],
      properties: {
        action: {
          type: 'string',
          enum: TOOL_ACTIONS,
          description:
            'left_click/double_click/right_click/mouse_move at `coordinate`; click_element clicks the element ' +
            'with `element_id` from the accessibility tree; type enters `text` (into `element_id` if given); key ' +
            'presses `keys` together; scroll by `pixels` (positive up, negative down); wait `time` seconds; ' +
            'answer ends the task with the final message `text`.',
        },
        coordinate: { type: 'array', items: { type: 'number' }, description: '[x, y] on the grid' },
        element_id: { type: 'integer' },
        text: { type: 'string' },
        keys: { type: 'array', items: { type: 'string' } },
        pixels: { type: 'number' },
        time: { type: 'number' },
      },
    },
  },
} as const;

export function systemPrompt(): string {
  return [
    'You are a web agent. You see a screenshot of a browser page, its accessibility tree and a goal.',
    'Choose exactly one next action and answer with exactly one tool call in this format:',
    '<tool_call>',
    '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [x, y]}}',
    '</tool_call>',
    '',
    'The tool:',
    JSON.stringify(COMPUTER_USE_TOOL.function),
    '',
    `Each accessibility-tree line is "[id] role "name" @(x,y)": the id works with click_element and type, and @(x,y) is the element's centre on the ${GRID_MAX}-grid.`,
  ].join('\n');
}

export function buildPrompt(obs: PromptObservation, history: HistoryEntry[], historyLength: number): PromptMessage[] {
  const recent = historyLength > 0 ? history.slice(-historyLength) : [];
  const lines = [
    `Goal: ${obs.goal}`,
    `URL: ${obs.url}`,
    `Step: ${obs.step}`,
    '',
    'Accessibility tree:',
    obs.axtree || '(empty)',
    '',
    recent.length ? 'Previous actions:\n' + recent.map((h) => `${h.step}. ${h.action}${h.note ? ` (${h.note})` : ''}`).join('\n') : 'Previous actions: none',
    '',
    'What is the next action?',
  ];
  return [{ role: 'system', content: [{ type: 'text', text: systemPrompt() }] }, userTurn(obs.screenshotRef, lines.join('\n'))];
}

/**
 * The user turn of every prompt (policy and critic): the screenshot, then the text. This is where untrusted text
 * (goal, URL, accessibility tree, previous actions, candidates) enters a prompt, so it is neutralised here and
 * nowhere else; the system turn is ours and keeps its tokens (`<tool_call>` is meant as the token). The learner
 * treats user turns the same way (halo_learner/prompt_text.py).
 */
export function userTurn(screenshotRef: string, text: string): PromptMessage {
  return {
    role: 'user',
    content: [
      { type: 'image', ref: screenshotRef },
      { type: 'text', text: neutraliseAddedTokens(text) },
    ],
  };
}
