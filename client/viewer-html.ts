import { GRID_MAX, describeAction, type AgentAction } from '../lib/model-io/actions';
import type { RewardBreakdown } from '../lib/rewards/types';

// The episode viewer's HTML: pure functions from a view model (built by client/commands/view.ts from the
// trajectory blob) to one self-contained page. Screenshots are data URLs; the action is an SVG overlay whose
// viewBox is the screenshot's own pixel size, so overlay coordinates are screenshot pixels.

export interface ImageView {
  /** data:image/png;base64,… */
  src: string;
  width: number;
  height: number;
}

/** Where the action landed, in grid units (0-1000) and in screenshot pixels. */
export interface Marker {
  kind: 'point' | 'element';
  gridX: number;
  gridY: number;
  x: number;
  y: number;
  label: string;
}

export interface Overlay {
  marker?: Marker;
  /** One line under the screenshot: keys, typed text, answer, scroll, or why there is no marker. */
  caption?: string;
}

export interface CandidateView {
  index: number;
  chosen: boolean;
  valid: boolean;
  reward: number;
  completion: string;
}

export interface StepView {
  step: number;
  url: string;
  image?: ImageView;
  /** Why there is no image (missing blob, unreadable file). */
  imageError?: string;
  overlay: Overlay;
  completion: string;
  action: AgentAction;
  valid: boolean;
  envReward: number;
  shaped: RewardBreakdown;
  done: boolean;
  actionError?: string;
  candidates?: CandidateView[];
}

export interface EpisodeHeader {
  workflowId: string;
  env: string;
  task: string;
  seed: number;
  goal: string;
  success: boolean;
  reward: number;
  reason: string | null;
  policyModel: string;
  steps: number;
  shapedReturn: number;
  actionValidity: number;
  trajectoryRef?: string;
}

export interface EpisodeView {
  header: EpisodeHeader;
  steps: StepView[];
  /** The page after the last step. */
  final?: { url: string; image?: ImageView; imageError?: string };
  /** The trajectory JSON, shown at the bottom of the page. */
  rawJson: string;
  /** Link to the trajectory JSON written next to the page (`--open-json`). */
  jsonHref?: string;
}

// ---------------------------------------------------------------------------------------------------------
// Overlay geometry (pure)

/** Grid (0-1000) to screenshot pixels, the same mapping the environment uses to act (env/page-actions.ts). */
export function gridToPixels(gx: number, gy: number, width: number, height: number): { x: number; y: number } {
  return { x: round2((gx / GRID_MAX) * width), y: round2((gy / GRID_MAX) * height) };
}

/** `[id] role "name" … @(x,y)` → the element's centre on the grid, or undefined when the id is not in the tree. */
export function findElementCentre(axtree: string, id: number): { x: number; y: number; line: string } | undefined {
  const prefix = `[${id}]`;
  for (const raw of axtree.split('\n')) {
    const line = raw.trim();
    if (!line.startsWith(prefix + ' ') && line !== prefix) continue;
    const m = /@\((\d+(?:\.\d+)?),\s*(\d+(?:\.\d+)?)\)\s*$/.exec(line);
    if (m) return { x: Number(m[1]), y: Number(m[2]), line };
  }
  return undefined;
}

/**
 * What to draw for an action on a screenshot of `size` pixels. Point actions map their grid coordinates;
 * element actions look the element up in the step's accessibility tree; the rest get a caption.
 */
export function planOverlay(action: AgentAction, axtree: string | undefined, size: { width: number; height: number }): Overlay {
  const point = (gx: number, gy: number, kind: Marker['kind'], label: string): Marker => ({
    kind,
    gridX: gx,
    gridY: gy,
    ...gridToPixels(gx, gy, size.width, size.height),
    label,
  });
  const element = (id: number, label: string): Overlay => {
    const c = axtree === undefined ? undefined : findElementCentre(axtree, id);
    if (!c) {
      return { caption: `element [${id}] is not in this step's accessibility tree${axtree === undefined ? ' (tree unavailable)' : ''}` };
    }
    return { marker: point(c.x, c.y, 'element', label), caption: c.line };
  };
  switch (action.type) {
    case 'click':
      return { marker: point(action.x, action.y, 'point', describeAction(action).replace(/ \(.*\)$/, '')) };
    case 'double_click':
      return { marker: point(action.x, action.y, 'point', 'double click') };
    case 'move':
      return { marker: point(action.x, action.y, 'point', 'move') };
    case 'click_element':
      return element(action.id, `[${action.id}]`);
    case 'type': {
      const text = `⌨ type ${JSON.stringify(action.text)}`;
      if (action.id === undefined) return { caption: `${text} (into the focused element)` };
      const o = element(action.id, `[${action.id}] type`);
      return { marker: o.marker, caption: o.marker ? `${text} into ${o.caption}` : `${text}; ${o.caption}` };
    }
    case 'key':
      return { caption: `⌨ key ${action.keys.join('+')}` };
    case 'scroll': {
      const caption = `↕ scroll ${action.direction} ${action.amount}px`;
      if (action.x !== undefined && action.y !== undefined) return { marker: point(action.x, action.y, 'point', `scroll ${action.direction}`), caption };
      return { caption };
    }
    case 'goto':
      return { caption: `→ goto ${action.url}` };
    case 'wait':
      return { caption: `⏱ wait ${action.seconds}s` };
    case 'answer':
      return { caption: `✉ answer ${JSON.stringify(action.text)}` };
    case 'invalid':
      return { caption: `✗ invalid output: ${action.reason}` };
  }
}

// ---------------------------------------------------------------------------------------------------------
// HTML

export function escapeHtml(s: string): string {
  return String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c] as string);
}

/** Any value as HTML text: numbers and booleans of a trajectory file are only typed, not checked, so they are escaped too. */
function esc(v: unknown): string {
  return escapeHtml(String(v));
}

function round2(n: number): number {
  return Math.round(n * 100) / 100;
}

function fmt(n: number): string {
  if (typeof n !== 'number' || !Number.isFinite(n)) return esc(n);
  const r = Math.round(n * 1000) / 1000;
  return (r > 0 ? '+' : '') + String(r);
}

function plain(n: number): string {
  return esc(Math.round(n * 1000) / 1000);
}

function markerSvg(m: Marker, size: { width: number; height: number }): string {
  const r = Math.max(8, Math.round(Math.max(size.width, size.height) * 0.016));
  const arm = r * 2.2;
  const gap = r * 0.35;
  const { x, y } = m;
  const lines = [
    [x - arm, y, x - gap, y],
    [x + gap, y, x + arm, y],
    [x, y - arm, x, y - gap],
    [x, y + gap, x, y + arm],
  ]
    .map(([x1, y1, x2, y2]) => `<line x1="${esc(round2(x1))}" y1="${esc(round2(y1))}" x2="${esc(round2(x2))}" y2="${esc(round2(y2))}"/>`)
    .join('');
  const fontSize = Math.max(14, Math.round(r * 1.3));
  // A label pill next to the marker, kept inside the image (left of the marker when it would run off the right).
  const padX = Math.round(fontSize * 0.4);
  const w = Math.round(m.label.length * fontSize * 0.62) + 2 * padX;
  const h = Math.round(fontSize * 1.4);
  const right = x + arm + 4 + w < size.width;
  const bx = right ? x + arm + 4 : Math.max(0, x - arm - 4 - w);
  const by = Math.min(Math.max(0, y - r - h), size.height - h);
  return (
    `<g class="marker" data-kind="${esc(m.kind)}" data-grid-x="${esc(m.gridX)}" data-grid-y="${esc(m.gridY)}" data-x="${esc(m.x)}" data-y="${esc(m.y)}">` +
    `<circle class="halo" cx="${esc(x)}" cy="${esc(y)}" r="${esc(r)}"/>` +
    `<circle class="ring" cx="${esc(x)}" cy="${esc(y)}" r="${esc(r)}"/>` +
    `<g class="cross">${lines}</g>` +
    `<circle class="dot" cx="${esc(x)}" cy="${esc(y)}" r="${esc(Math.max(2, Math.round(r / 5)))}"/>` +
    `<rect class="label-bg" x="${esc(round2(bx))}" y="${esc(round2(by))}" width="${esc(w)}" height="${esc(h)}" rx="${esc(Math.round(h / 4))}"/>` +
    `<text x="${esc(round2(bx + w / 2))}" y="${esc(round2(by + h / 2))}" dy="0.35em" font-size="${esc(fontSize)}" text-anchor="middle">${escapeHtml(m.label)}</text>` +
    `</g>`
  );
}

function screenshotHtml(image: ImageView | undefined, imageError: string | undefined, overlay: Overlay | undefined, alt: string): string {
  if (!image) return `<div class="noimage">${escapeHtml(imageError ?? 'no screenshot')}</div>`;
  const svg =
    `<svg class="overlay" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${esc(image.width)} ${esc(image.height)}" preserveAspectRatio="none" ` +
    `data-width="${esc(image.width)}" data-height="${esc(image.height)}">${overlay?.marker ? markerSvg(overlay.marker, image) : ''}</svg>`;
  return `<div class="frame"><img src="${esc(image.src)}" width="${esc(image.width)}" height="${esc(image.height)}" alt="${escapeHtml(alt)}">${svg}</div>`;
}

function breakdownHtml(b: RewardBreakdown): string {
  const rows = b.terms
    .map(
      (t) =>
        `<tr class="term" data-term="${escapeHtml(t.term)}" data-value="${esc(t.value)}"><td><code>${escapeHtml(t.term)}</code></td>` +
        `<td class="num ${t.value < 0 ? 'neg' : t.value > 0 ? 'pos' : ''}">${fmt(t.value)}</td><td>${escapeHtml(t.detail ?? '')}</td></tr>`,
    )
    .join('');
  const empty = b.terms.length === 0 ? '<tr><td colspan="3" class="muted">no terms fired</td></tr>' : '';
  return (
    `<table class="breakdown"><thead><tr><th>term</th><th>value</th><th>detail</th></tr></thead><tbody>${rows}${empty}</tbody>` +
    `<tfoot><tr class="total" data-value="${esc(b.total)}"><td>total</td><td class="num">${fmt(b.total)}</td><td></td></tr></tfoot></table>`
  );
}

function candidatesHtml(cands: CandidateView[]): string {
  const rows = cands
    .map(
      (c) =>
        `<tr class="candidate${c.chosen ? ' chosen' : ''}"><td>${esc(c.index)}${c.chosen ? ' ✓' : ''}</td><td>${c.valid ? 'valid' : 'invalid'}</td>` +
        `<td class="num">${fmt(c.reward)}</td><td><pre>${escapeHtml(c.completion)}</pre></td></tr>`,
    )
    .join('');
  return (
    `<details class="group"><summary>${esc(cands.length)} candidates sampled at this state (GRPO group; ✓ = continued from)</summary>` +
    `<table><thead><tr><th>#</th><th>action</th><th>shaped reward</th><th>completion</th></tr></thead><tbody>${rows}</tbody></table></details>`
  );
}

function stepHtml(s: StepView): string {
  const title = describeAction(s.action);
  const badges = [
    s.valid ? '<span class="badge ok">valid</span>' : '<span class="badge bad">invalid</span>',
    s.done ? '<span class="badge">done</span>' : '',
    s.actionError ? '<span class="badge bad">action error</span>' : '',
  ].join('');
  return `
<section class="step" id="step-${esc(s.step)}" data-step="${esc(s.step)}" data-action="${escapeHtml(s.action.type)}" data-valid="${esc(s.valid)}" data-env-reward="${esc(s.envReward)}" data-shaped="${esc(s.shaped.total)}">
  <h2><a href="#step-${esc(s.step)}">Step ${esc(s.step)}</a> · ${escapeHtml(title)} ${badges}</h2>
  <div class="cols">
    <figure class="shot">
      ${screenshotHtml(s.image, s.imageError, s.overlay, `screenshot before step ${esc(s.step)}`)}
      ${s.overlay.caption ? `<figcaption class="caption">${escapeHtml(s.overlay.caption)}</figcaption>` : ''}
    </figure>
    <div class="details">
      <dl>
        <dt>URL</dt><dd class="url">${escapeHtml(s.url)}</dd>
        <dt>env reward</dt><dd class="env-reward">${plain(s.envReward)}</dd>
        <dt>shaped reward</dt><dd class="shaped-total">${fmt(s.shaped.total)}</dd>
        ${s.actionError ? `<dt>action error</dt><dd class="action-error">${escapeHtml(s.actionError)}</dd>` : ''}
      </dl>
      <h3>Shaped reward terms</h3>
      ${breakdownHtml(s.shaped)}
      <h3>Parsed action</h3>
      <pre class="action">${escapeHtml(JSON.stringify(s.action, null, 2))}</pre>
      <h3>Model output</h3>
      <pre class="completion">${escapeHtml(s.completion) || '<span class="muted">(empty)</span>'}</pre>
      ${s.candidates?.length ? candidatesHtml(s.candidates) : ''}
    </div>
  </div>
</section>`;
}

const CSS = `
:root { --fg:#1d2330; --muted:#6b7385; --bg:#f6f7f9; --card:#fff; --line:#dde1e8; --ok:#11805a; --bad:#c23030; --accent:#e4572e; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color:var(--fg); background:var(--bg); }
header.episode { padding:16px 24px; background:var(--card); border-bottom:1px solid var(--line); position:sticky; top:0; z-index:5; }
header.episode h1 { margin:0 0 6px; font-size:18px; }
header.episode .goal { margin:4px 0 8px; font-size:15px; }
.facts { display:flex; flex-wrap:wrap; gap:6px 18px; color:var(--muted); }
.facts b { color:var(--fg); font-weight:600; }
nav.steps { display:flex; flex-wrap:wrap; gap:4px; margin-top:8px; }
nav.steps a { padding:1px 7px; border:1px solid var(--line); border-radius:10px; text-decoration:none; color:var(--fg); font-size:12px; }
nav.steps a.invalid { border-color:var(--bad); color:var(--bad); }
main { padding:16px 24px; }
section.step, section.final { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px 16px; margin:0 0 16px; }
section h2 { font-size:16px; margin:0 0 10px; }
section h2 a { color:inherit; text-decoration:none; }
h3 { font-size:13px; margin:12px 0 4px; color:var(--muted); text-transform:uppercase; letter-spacing:.04em; }
.cols { display:grid; grid-template-columns:minmax(0,3fr) minmax(0,2fr); gap:16px; align-items:start; }
@media (max-width: 1100px) { .cols { grid-template-columns:1fr; } }
figure.shot { margin:0; }
.frame { position:relative; line-height:0; border:1px solid var(--line); }
.frame img { width:100%; height:auto; display:block; }
.frame svg.overlay { position:absolute; inset:0; width:100%; height:100%; pointer-events:none; overflow:visible; }
.marker .halo { fill:none; stroke:#fff; stroke-width:6; opacity:.9; }
.marker .ring { fill:rgba(228,87,46,.15); stroke:var(--accent); stroke-width:3; }
.marker .cross line { stroke:var(--accent); stroke-width:3; }
.marker .dot { fill:var(--accent); }
.marker .label-bg { fill:var(--accent); opacity:.92; }
.marker text { fill:#fff; font-weight:700; font-family:system-ui, sans-serif; }
.caption { margin-top:6px; padding:6px 10px; background:#1d2330; color:#fff; border-radius:4px; font-family:ui-monospace, monospace; font-size:13px; white-space:pre-wrap; word-break:break-word; }
.noimage { padding:40px; text-align:center; color:var(--bad); border:1px dashed var(--bad); }
dl { display:grid; grid-template-columns:max-content 1fr; gap:2px 12px; margin:0; }
dt { color:var(--muted); }
dd { margin:0; word-break:break-all; }
pre { background:#f0f2f5; padding:8px; border-radius:4px; white-space:pre-wrap; word-break:break-word; margin:0; font-size:12.5px; max-height:360px; overflow:auto; }
table { border-collapse:collapse; width:100%; font-size:13px; }
th, td { text-align:left; padding:3px 6px; border-bottom:1px solid var(--line); vertical-align:top; }
td.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
.pos { color:var(--ok); } .neg { color:var(--bad); } .muted { color:var(--muted); }
tfoot td { font-weight:600; border-bottom:0; }
.badge { display:inline-block; font-size:11px; padding:0 6px; border-radius:8px; border:1px solid var(--line); color:var(--muted); vertical-align:middle; margin-left:4px; }
.badge.ok { color:var(--ok); border-color:var(--ok); } .badge.bad { color:var(--bad); border-color:var(--bad); }
.success { color:var(--ok); font-weight:700; } .failure { color:var(--bad); font-weight:700; }
tr.chosen td { background:#eef8f3; }
#toggle-overlay:not(:checked) ~ main svg.overlay { display:none; }
label.toggle { position:fixed; right:16px; bottom:12px; background:var(--card); border:1px solid var(--line); border-radius:6px; padding:4px 8px; z-index:6; }
`;

/** The whole page. */
export function renderEpisodeHtml(v: EpisodeView): string {
  const h = v.header;
  const title = `${h.env}/${h.task} seed ${esc(h.seed)} · ${h.success ? 'success' : 'failure'} · ${h.workflowId}`;
  const nav = v.steps
    .map(
      (s) =>
        `<a href="#step-${esc(s.step)}" class="${s.valid ? '' : 'invalid'}" title="${escapeHtml(describeAction(s.action))}">${esc(s.step)}: ${escapeHtml(s.action.type)} ${fmt(s.shaped.total)}</a>`,
    )
    .join('');
  const final = v.final
    ? `
<section class="final" id="final">
  <h2>After the last step</h2>
  <div class="cols"><figure class="shot">${screenshotHtml(v.final.image, v.final.imageError, undefined, 'final page')}</figure>
  <div class="details"><dl><dt>URL</dt><dd class="url">${escapeHtml(v.final.url)}</dd></dl></div></div>
</section>`
    : '';
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)}</title>
<style>${CSS}</style>
</head>
<body>
<input type="checkbox" id="toggle-overlay" checked hidden>
<header class="episode" data-success="${esc(h.success)}" data-reward="${esc(h.reward)}" data-steps="${esc(h.steps)}">
  <h1>${escapeHtml(h.env)}/${escapeHtml(h.task)} <span class="muted">seed ${esc(h.seed)}</span> · <span class="${h.success ? 'success' : 'failure'}">${h.success ? 'success' : 'failure'}</span></h1>
  <div class="goal"><b>Goal:</b> ${escapeHtml(h.goal)}</div>
  <div class="facts">
    <span>reward <b class="reward">${plain(h.reward)}</b></span>
    <span>steps <b class="steps">${esc(h.steps)}</b></span>
    <span>shaped return <b>${fmt(h.shapedReturn)}</b></span>
    <span>action validity <b>${esc(Math.round(h.actionValidity * 100))}%</b></span>
    ${h.reason ? `<span>end <b>${escapeHtml(h.reason)}</b></span>` : ''}
    <span>policy <b>${escapeHtml(h.policyModel)}</b></span>
    <span>workflow <b>${escapeHtml(h.workflowId)}</b></span>
    ${h.trajectoryRef ? `<span>trajectory <b>${escapeHtml(h.trajectoryRef)}</b></span>` : ''}
    ${v.jsonHref ? `<span><a href="${escapeHtml(v.jsonHref)}">trajectory JSON</a></span>` : ''}
  </div>
  <nav class="steps">${nav}</nav>
</header>
<label class="toggle"><input type="checkbox" checked onchange="document.getElementById('toggle-overlay').checked=this.checked"> action overlay</label>
<main>
${v.steps.map(stepHtml).join('\n')}
${final}
<details class="raw"><summary>Trajectory JSON</summary><pre>${escapeHtml(v.rawJson)}</pre></details>
</main>
</body>
</html>
`;
}
