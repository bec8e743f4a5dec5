import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { actionSchema, type AgentAction } from '../../lib/model-io/actions';
import { ACCEPTED_ACTION_NAMES, EXCERPT_CHARS, MAX_OUTPUT_CHARS, parseAction } from '../../lib/model-io/parse';

/** A Qwen3-VL computer_use tool call wrapping `args`, as the model emits it. */
function toolCall(args: unknown, name = 'computer_use'): string {
  return `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`;
}

/** Parses and asserts the result is valid and passes the schema unchanged. */
function parseValid(text: string): AgentAction {
  const action = parseAction(text);
  assert.notEqual(action.type, 'invalid', `expected a valid action, got ${JSON.stringify(action)}`);
  assert.deepEqual(actionSchema.parse(action), action);
  return action;
}

describe('parseAction: Qwen3-VL tool calls', () => {
  const cases: Array<[string, unknown, AgentAction]> = [
    ['left_click', { action: 'left_click', coordinate: [100, 200] }, { type: 'click', x: 100, y: 200, button: 'left', count: 1 }],
    ['right_click', { action: 'right_click', coordinate: [5, 6] }, { type: 'click', x: 5, y: 6, button: 'right', count: 1 }],
    ['middle_click', { action: 'middle_click', coordinate: [7, 8] }, { type: 'click', x: 7, y: 8, button: 'middle', count: 1 }],
    ['double_click', { action: 'double_click', coordinate: [9, 10] }, { type: 'double_click', x: 9, y: 10 }],
    ['triple_click', { action: 'triple_click', coordinate: [11, 12] }, { type: 'click', x: 11, y: 12, button: 'left', count: 3 }],
    ['mouse_move', { action: 'mouse_move', coordinate: [13, 14] }, { type: 'move', x: 13, y: 14 }],
    ['type', { action: 'type', text: 'hello world' }, { type: 'type', text: 'hello world' }],
    ['key (array)', { action: 'key', keys: ['ctrl', 'l'] }, { type: 'key', keys: ['ctrl', 'l'] }],
    ['key (string "ctrl+a")', { action: 'key', keys: 'ctrl+a' }, { type: 'key', keys: ['ctrl', 'a'] }],
    ['key (single string)', { action: 'key', keys: 'Enter' }, { type: 'key', keys: ['Enter'] }],
    ['key (string "ctrl++" is the plus key)', { action: 'key', keys: 'ctrl++' }, { type: 'key', keys: ['ctrl', '+'] }],
    ['scroll up', { action: 'scroll', pixels: 300 }, { type: 'scroll', direction: 'up', amount: 300 }],
    ['scroll down with coordinate', { action: 'scroll', pixels: -500, coordinate: [500, 400] }, { type: 'scroll', direction: 'down', amount: 500, x: 500, y: 400 }],
    ['hscroll right', { action: 'hscroll', pixels: 200 }, { type: 'scroll', direction: 'right', amount: 200 }],
    ['hscroll left', { action: 'hscroll', pixels: -150 }, { type: 'scroll', direction: 'left', amount: 150 }],
    ['wait', { action: 'wait', time: 2 }, { type: 'wait', seconds: 2 }],
    ['wait without time', { action: 'wait' }, { type: 'wait', seconds: 1 }],
    ['answer', { action: 'answer', text: 'The price is $42' }, { type: 'answer', text: 'The price is $42' }],
    ['terminate', { action: 'terminate', status: 'success' }, { type: 'answer', text: 'success' }],
    ['click_element (element_id)', { action: 'click_element', element_id: 3 }, { type: 'click_element', id: 3 }],
    ['click_element (id)', { action: 'click_element', id: 0 }, { type: 'click_element', id: 0 }],
    ['goto', { action: 'goto', url: 'https://example.com' }, { type: 'goto', url: 'https://example.com' }],
    ['navigate', { action: 'navigate', url: 'https://example.com/a' }, { type: 'goto', url: 'https://example.com/a' }],
    ['type into element', { action: 'type', text: 'x', element_id: 4 }, { type: 'type', text: 'x', id: 4 }],
  ];
  for (const [name, args, expected] of cases) {
    it(`maps ${name}`, () => assert.deepEqual(parseValid(toolCall(args)), expected));
  }

  it('accepts the browser_use tool name', () => {
    assert.deepEqual(parseValid(toolCall({ action: 'left_click', coordinate: [1, 2] }, 'browser_use')), {
      type: 'click',
      x: 1,
      y: 2,
      button: 'left',
      count: 1,
    });
  });

  it('finds a tool call surrounded by prose', () => {
    const text = `I need to open the search box first.\n${toolCall({ action: 'left_click', coordinate: [640, 88] })}\nThis should focus it.`;
    assert.deepEqual(parseValid(text), { type: 'click', x: 640, y: 88, button: 'left', count: 1 });
  });

  it('ignores a fake tool call inside a think block', () => {
    const text = `<think>Maybe ${toolCall({ action: 'left_click', coordinate: [1, 1] })}? No, the button is lower.</think>\n${toolCall({ action: 'left_click', coordinate: [300, 700] })}`;
    assert.deepEqual(parseValid(text), { type: 'click', x: 300, y: 700, button: 'left', count: 1 });
  });

  it('treats text before an orphan </think> as reasoning (opening tag was in the prompt)', () => {
    const text = `draft ${toolCall({ action: 'left_click', coordinate: [1, 1] })}</think>${toolCall({ action: 'type', text: 'ok' })}`;
    assert.deepEqual(parseValid(text), { type: 'type', text: 'ok' });
  });

  it('accepts a missing closing </tool_call> when the JSON is complete', () => {
    const text = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [10, 20]}}';
    assert.deepEqual(parseValid(text), { type: 'click', x: 10, y: 20, button: 'left', count: 1 });
  });

  it('rounds float coordinates to integers', () => {
    assert.deepEqual(parseValid(toolCall({ action: 'left_click', coordinate: [10.4, 20.6] })), {
      type: 'click',
      x: 10,
      y: 21,
      button: 'left',
      count: 1,
    });
  });

  it('accepts the grid boundaries 0 and 1000', () => {
    assert.deepEqual(parseValid(toolCall({ action: 'mouse_move', coordinate: [0, 1000] })), { type: 'move', x: 0, y: 1000 });
    assert.deepEqual(parseValid(toolCall({ action: 'mouse_move', coordinate: [1000, 0] })), { type: 'move', x: 1000, y: 0 });
  });

  it('handles braces and escaped quotes inside JSON strings', () => {
    const text = toolCall({ action: 'type', text: 'a } tricky { "quoted" \\ string' });
    assert.deepEqual(parseValid(text), { type: 'type', text: 'a } tricky { "quoted" \\ string' });
  });
});

describe('parseAction: plain JSON', () => {
  it('accepts a flat action with x/y', () => {
    assert.deepEqual(parseValid('{"action": "click", "x": 120, "y": 40}'), { type: 'click', x: 120, y: 40, button: 'left', count: 1 });
  });

  it('accepts our schema type names via "type"', () => {
    assert.deepEqual(parseValid('{"type": "click_element", "id": 3}'), { type: 'click_element', id: 3 });
    assert.deepEqual(parseValid('{"type": "scroll", "direction": "down", "amount": 600}'), { type: 'scroll', direction: 'down', amount: 600 });
    assert.deepEqual(parseValid('{"type": "click", "x": 1, "y": 2, "button": "right", "count": 2}'), {
      type: 'click',
      x: 1,
      y: 2,
      button: 'right',
      count: 2,
    });
    assert.deepEqual(parseValid('{"type": "wait", "seconds": 3}'), { type: 'wait', seconds: 3 });
    assert.deepEqual(parseValid('{"type": "double_click", "x": 5, "y": 6}'), { type: 'double_click', x: 5, y: 6 });
  });

  it('accepts Qwen names in the flat shape', () => {
    assert.deepEqual(parseValid('{"action":"left_click","coordinate":[30,40]}'), { type: 'click', x: 30, y: 40, button: 'left', count: 1 });
    assert.deepEqual(parseValid('{"action":"type","text":"hi"}'), { type: 'type', text: 'hi' });
  });

  it('accepts the {name, arguments} shape without tags', () => {
    const text = '{"name": "computer_use", "arguments": {"action": "key", "keys": ["Enter"]}}';
    assert.deepEqual(parseValid(text), { type: 'key', keys: ['Enter'] });
  });

  it('accepts fenced JSON with prose around it', () => {
    const text = 'Next I will type the query.\n```json\n{"action": "type", "text": "cheap flights"}\n```\nDone.';
    assert.deepEqual(parseValid(text), { type: 'type', text: 'cheap flights' });
  });

  it('skips a non-JSON {...} in prose before the real object', () => {
    const text = 'Coordinates are {x, y}. {"action": "mouse_move", "x": 5, "y": 5}';
    assert.deepEqual(parseValid(text), { type: 'move', x: 5, y: 5 });
  });

  it('accepts text just under the length limit', () => {
    const text = `${' '.repeat(MAX_OUTPUT_CHARS - 40)}{"action":"wait","time":1}`;
    assert.ok(text.length <= MAX_OUTPUT_CHARS);
    assert.deepEqual(parseValid(text), { type: 'wait', seconds: 1 });
  });

  it('exposes the accepted action names', () => {
    for (const name of [
      'left_click',
      'right_click',
      'middle_click',
      'double_click',
      'triple_click',
      'mouse_move',
      'type',
      'key',
      'scroll',
      'hscroll',
      'wait',
      'answer',
      'terminate',
      'click_element',
      'goto',
      'navigate',
      'click',
      'move',
    ]) {
      assert.ok(ACCEPTED_ACTION_NAMES.includes(name), name);
    }
    assert.ok(!ACCEPTED_ACTION_NAMES.includes('left_click_drag'));
  });
});

describe('parseAction: malformed and edge-case input', () => {
  const qwen = (args: unknown) => toolCall(args);
  const click = (coordinate: unknown) => qwen({ action: 'left_click', coordinate });

  // [description, input, expected reason]
  const cases: Array<[string, unknown, RegExp]> = [
    // Empty / size
    ['empty string', '', /^empty output$/],
    ['whitespace only', '  \n\t  \r\n', /^empty output$/],
    ['5 MB of text', 'x'.repeat(5 * 1024 * 1024), /^output too long \(5242880 chars\)$/],
    ['just over the limit', '{'.repeat(MAX_OUTPUT_CHARS + 1), /^output too long \(20001 chars\)$/],
    // No action
    ['prose only', 'I think I should click the login button now.', /^no action found$/],
    ['only a think block', '<think>click at {100, 200}? maybe ' + toolCall({ action: 'left_click', coordinate: [1, 2] }) + '</think>', /^no action found$/],
    ['unterminated think block', '<think>I will ' + toolCall({ action: 'left_click', coordinate: [1, 2] }), /no action found \(unterminated <think>/],
    ['null', 'null', /JSON null at top level/],
    ['number literal', '42', /JSON number at top level/],
    ['JSON array at top level', '[{"action": "click", "x": 1, "y": 2}]', /JSON array at top level/],
    ['fenced JSON array', '```json\n[{"action": "click", "x": 1, "y": 2}]\n```', /JSON array at top level/],
    // Truncation / brace balance
    ['truncated tool call', '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_cl', /^truncated tool call/],
    ['truncated inside coordinate', '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [10, 2', /^truncated tool call/],
    ['tool call closed but JSON not', '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click"}</tool_call>', /^truncated tool call/],
    ['truncated plain JSON', '{"action": "type", "text": "hel', /^truncated JSON/],
    ['truncated fenced JSON', '```json\n{"action": "click", "x": 10,', /^truncated JSON/],
    ['unbalanced braces (extra opener)', '{{"action": "click", "x": 1, "y": 2}', /^truncated JSON.*unbalanced/],
    ['empty tool call', '<tool_call>\n</tool_call>', /contains no JSON object/],
    // Invalid JSON
    ['single quotes in tool call', "<tool_call>{'name': 'computer_use', 'arguments': {'action': 'left_click', 'coordinate': [1, 2]}}</tool_call>", /^invalid JSON in tool call/],
    ['trailing comma in tool call', '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1, 2],}}</tool_call>', /^invalid JSON in tool call/],
    ['NaN literal', '{"action": "click", "x": NaN, "y": 2}', /^invalid JSON/],
    ['unquoted keys', '{action: "click", x: 1, y: 2}', /^invalid JSON/],
    // Tool call count / envelope
    ['two tool calls', qwen({ action: 'left_click', coordinate: [1, 2] }) + qwen({ action: 'type', text: 'a' }), /^2 tool calls; exactly one expected$/],
    ['three tool calls', qwen({ action: 'wait' }).repeat(3), /^3 tool calls; exactly one expected$/],
    ['unknown tool name', toolCall({ action: 'left_click', coordinate: [1, 2] }, 'web_search'), /unknown tool "web_search"/],
    ['tool name not a string', '<tool_call>{"name": 7, "arguments": {"action": "wait"}}</tool_call>', /^name: must be a string \(got number\)/],
    ['missing tool name', '<tool_call>{"arguments": {"action": "wait"}}</tool_call>', /has no "name"/],
    ['missing arguments', '<tool_call>{"name": "computer_use"}</tool_call>', /has no "arguments"/],
    ['arguments is an array', '<tool_call>{"name": "computer_use", "arguments": ["left_click", 1, 2]}</tool_call>', /^arguments: must be an object \(got array\)/],
    ['arguments is null', '<tool_call>{"name": "computer_use", "arguments": null}</tool_call>', /^arguments: must be an object \(got null\)/],
    [
      'nested JSON string as arguments',
      '<tool_call>{"name": "computer_use", "arguments": "{\\"action\\": \\"left_click\\", \\"coordinate\\": [1, 2]}"}</tool_call>',
      /^arguments: must be an object \(got string\)/,
    ],
    // Action names
    ['missing action field', qwen({ coordinate: [1, 2] }), /missing "action" field/],
    ['flat object without action', '{"x": 1, "y": 2}', /missing "action" field/],
    ['action is a number', qwen({ action: 5 }), /^action: must be a string \(got number\)/],
    ['unknown action', qwen({ action: 'fly_to_moon' }), /^unsupported action "fly_to_moon"/],
    ['left_click_drag', qwen({ action: 'left_click_drag', coordinate: [1, 2] }), /^unsupported action "left_click_drag"/],
    ['prototype name as action', '{"action": "constructor"}', /^unsupported action "constructor"/],
    ['invalid type name', '{"type": "invalid", "reason": "x"}', /^unsupported action "invalid"/],
    // Coordinates
    ['coordinate as numeric strings', click(['120', 40]), /^coordinate\[0\]: must be a number \(got string\)/],
    ['flat x as numeric string', '{"action": "click", "x": "120", "y": 40}', /^x: must be a number \(got string\)/],
    ['coordinate as JSON string', click('[100, 200]'), /^coordinate: must be \[x, y\].*got string/],
    ['coordinate of length 1', click([100]), /^coordinate: must be \[x, y\].*length 1/],
    ['coordinate of length 3', click([1, 2, 3]), /^coordinate: must be \[x, y\].*length 3/],
    ['coordinate is null', click(null), /^coordinate: must be \[x, y\].*got null/],
    ['coordinate with null element', click([null, 5]), /^coordinate\[0\]: must be a number \(got null\)/],
    ['x above 1000', click([1001, 5]), /^coordinate\[0\]: must be between 0 and 1000 \(got 1001\)/],
    ['y above 1000 (float)', click([5, 1000.4]), /^coordinate\[1\]: must be between 0 and 1000/],
    ['negative x', click([-1, 5]), /^coordinate\[0\]: must be between 0 and 1000 \(got -1\)/],
    ['negative flat y', '{"action": "move", "x": 3, "y": -0.5}', /^y: must be between 0 and 1000/],
    ['infinite coordinate (1e999)', '{"action": "click", "x": 1e999, "y": 2}', /^x: must be a finite number/],
    ['click without coordinate', qwen({ action: 'left_click' }), /^left_click: missing coordinate/],
    ['flat click missing y', '{"action": "click", "x": 3}', /^y: is required/],
    // Per-action argument types
    ['type text as number', qwen({ action: 'type', text: 42 }), /^text: must be a string \(got number\)/],
    ['type text missing', qwen({ action: 'type' }), /^text: is required/],
    ['type text too long', qwen({ action: 'type', text: 'a'.repeat(2001) }), /^text: must be at most 2000 characters/],
    ['keys as number', qwen({ action: 'key', keys: 13 }), /^keys: must be an array of strings.*got number/],
    ['keys empty array', qwen({ action: 'key', keys: [] }), /^keys: must be at least 1 items/],
    ['keys with a number', qwen({ action: 'key', keys: ['ctrl', 1] }), /^keys\.1: must be a string \(got number\)/],
    ['keys missing', qwen({ action: 'key' }), /^keys: is required/],
    ['scroll without pixels', qwen({ action: 'scroll' }), /^scroll: missing "pixels"/],
    ['scroll pixels as string', qwen({ action: 'scroll', pixels: '-300' }), /^pixels: must be a number \(got string\)/],
    ['scroll pixels zero', qwen({ action: 'scroll', pixels: 0 }), /^pixels: must be non-zero/],
    ['scroll too far', qwen({ action: 'scroll', pixels: 99999 }), /^amount: must be <= 5000/],
    ['scroll bad direction', '{"type": "scroll", "direction": "sideways"}', /^direction: must be one of "up", "down", "left", "right"/],
    ['click_element negative id', qwen({ action: 'click_element', element_id: -1 }), /^id: must be >= 0/],
    ['click_element non-integer id', qwen({ action: 'click_element', element_id: 2.5 }), /^id: must be an integer \(got 2\.5\)/],
    ['click_element id as string', '{"type": "click_element", "id": "3"}', /^id: must be a number \(got string\)/],
    ['click_element missing id', qwen({ action: 'click_element' }), /^id: is required/],
    ['goto with empty url', qwen({ action: 'goto', url: '' }), /^url: must not be empty/],
    ['goto without url', qwen({ action: 'navigate' }), /^url: is required/],
    ['wait 999 seconds', qwen({ action: 'wait', time: 999 }), /^seconds: must be <= 30/],
    ['wait negative', '{"type": "wait", "seconds": -1}', /^seconds: must be >= 0/],
    ['answer text not a string', qwen({ action: 'answer', text: { value: 1 } }), /^text: must be a string \(got object\)/],
    ['terminate without status', qwen({ action: 'terminate' }), /^status: is required/],
    ['terminate status as boolean', qwen({ action: 'terminate', status: true }), /^status: must be a string \(got boolean\)/],
    ['click with bad button', '{"type": "click", "x": 1, "y": 2, "button": "back"}', /^button: must be one of "left", "right", "middle"/],
    ['click count 4', '{"type": "click", "x": 1, "y": 2, "count": 4}', /^count: must be <= 3/],
    // Non-string runtime input
    ['undefined input', undefined, /^expected a string, got undefined$/],
    ['number input', 42, /^expected a string, got number$/],
    ['object input', { action: 'click', x: 1, y: 2 }, /^expected a string, got object$/],
    ['null input', null, /^expected a string, got null$/],
  ];

  for (const [name, input, reason] of cases) {
    it(`rejects: ${name}`, () => {
      const action = parseAction(input as never);
      assert.equal(action.type, 'invalid', `expected invalid, got ${JSON.stringify(action)}`);
      if (action.type !== 'invalid') return;
      assert.match(action.reason, reason);
      assert.ok(action.excerpt.length <= EXCERPT_CHARS, `excerpt is ${action.excerpt.length} chars`);
      if (typeof input === 'string') assert.equal(action.excerpt, input.slice(0, EXCERPT_CHARS));
    });
  }

  it('has at least 35 malformed cases', () => assert.ok(cases.length >= 35));

  it('keeps reasons short even for long offending values', () => {
    const action = parseAction(qwen({ action: 'x'.repeat(5000) }));
    assert.equal(action.type, 'invalid');
    if (action.type === 'invalid') assert.ok(action.reason.length <= 200);
  });

  it('does not throw on pathological nesting', () => {
    const deep = '{"a":'.repeat(3000) + '1' + '}'.repeat(3000);
    assert.equal(parseAction(deep).type, 'invalid');
    assert.equal(parseAction('<think>'.repeat(2500)).type, 'invalid');
    assert.equal(parseAction('<tool_call>'.repeat(1500)).type, 'invalid');
  });
});
