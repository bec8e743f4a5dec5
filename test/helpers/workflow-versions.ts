import ts from 'typescript';

/**
 * What keeps an upgrade from stranding a run in flight, as checks over text: every `patched(id)` in workflow
 * code has a row in the patch table of docs/architecture.md (so an operator knows when it may go), and the recorded histories
 * that test/integration/replay.test.ts replays cover every workflow type and the new branch of every patch.
 */

export interface PatchCall {
  id: string;
  file: string;
}

/** `patched('id')` and `deprecatePatch('id')` calls of workflow sources; a call whose id is not a string literal is a problem. */
export function patchCalls(sources: Map<string, string>): { calls: PatchCall[]; problems: string[] } {
  const calls: PatchCall[] = [];
  const problems: string[] = [];
  for (const [file, text] of sources) {
    const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
    const visit = (node: ts.Node) => {
      if (ts.isCallExpression(node) && ts.isIdentifier(node.expression) && (node.expression.text === 'patched' || node.expression.text === 'deprecatePatch')) {
        const arg = node.arguments[0];
        if (arg && ts.isStringLiteralLike(arg)) calls.push({ id: arg.text, file });
        else {
          const line = source.getLineAndCharacterOfPosition(node.getStart()).line + 1;
          // The table and the history check can only follow ids they can read.
          problems.push(`${file}:${line}: ${node.expression.text}() with an id that is not a string literal`);
        }
      }
      ts.forEachChild(node, visit);
    };
    visit(source);
  }
  return { calls, problems };
}

export interface PatchRow {
  ids: string[];
  where: string;
}

/** The rows of the patch table (docs/architecture.md): the table under the "Workflow versions" heading whose first column is `patch id`. */
export function patchTable(markdown: string): PatchRow[] {
  const lines = markdown.split('\n');
  const heading = lines.findIndex((l) => /^#+ .*Workflow versions/.test(l));
  if (heading < 0) return [];
  const start = lines.findIndex((l, i) => i > heading && /^\|\s*patch id\s*\|/.test(l));
  if (start < 0) return [];
  const rows: PatchRow[] = [];
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith('|')) break;
    const cells = line.split('|').map((c) => c.trim());
    rows.push({ ids: [...cells[1].matchAll(/`([^`]+)`/g)].map((m) => m[1]), where: cells[2] ?? '' });
  }
  return rows;
}

/** Ids in code without a row (or whose row does not name their file), and rows whose id no workflow calls. */
export function patchTableProblems(calls: PatchCall[], rows: PatchRow[]): string[] {
  const problems: string[] = [];
  for (const { id, file } of calls) {
    const row = rows.find((r) => r.ids.includes(id));
    const base = file.split('/').at(-1)!;
    if (!row) problems.push(`patch '${id}' (${file}) has no row in the patch table of docs/architecture.md`);
    else if (!row.where.includes(base)) problems.push(`the patch table's row for '${id}' does not name ${base}, where it is called`);
  }
  for (const row of rows) for (const id of row.ids) if (!calls.some((c) => c.id === id)) problems.push(`the patch table names '${id}', which no workflow calls`);
  return [...new Set(problems)];
}

/** What a recorded history shows: its workflow type and the patch ids it recorded markers for. */
export interface HistorySummary {
  file: string;
  workflowType: string;
  patches: string[];
}

interface HistoryEvent {
  workflowExecutionStartedEventAttributes?: { workflowType?: { name?: string } };
  markerRecordedEventAttributes?: { markerName?: string; details?: Record<string, { payloads?: { data?: string }[] }> };
}

/** A history in the JSON `temporal workflow show --output json` writes (payload data in base64). */
export function summarizeHistory(file: string, history: { events: HistoryEvent[] }): HistorySummary {
  const workflowType = history.events[0]?.workflowExecutionStartedEventAttributes?.workflowType?.name ?? '';
  const patches = history.events.flatMap((e) => {
    const m = e.markerRecordedEventAttributes;
    const data = m?.markerName === 'core_patch' ? m.details?.['patch-data']?.payloads?.[0]?.data : undefined;
    return data ? [(JSON.parse(Buffer.from(data, 'base64').toString('utf8')) as { id: string }).id] : [];
  });
  return { file, workflowType, patches: [...new Set(patches)] };
}

/** Workflow types with no recorded history, and patch ids whose new branch no history took. */
export function historyCoverageProblems(histories: HistorySummary[], workflowTypes: string[], patchIds: string[]): string[] {
  const problems: string[] = [];
  for (const t of workflowTypes) if (!histories.some((h) => h.workflowType === t)) problems.push(`no recorded history of workflow type ${t}`);
  for (const id of new Set(patchIds)) if (!histories.some((h) => h.patches.includes(id))) problems.push(`no recorded history took the patched('${id}') branch`);
  return problems;
}
