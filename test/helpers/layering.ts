import { builtinModules } from 'node:module';
import { posix } from 'node:path';
import ts from 'typescript';

/**
 * The layering of the repository as a check over source text, so it runs on the real tree and on small
 * in-memory examples alike. Layers point down only:
 *
 *   lib/  ←  env/ blob/ host/  ←  activities/  ←  workflows/ (activities by type only)  ←  workers/  ←  client/
 *
 * Workflow code runs in the sandbox: Node modules and the Node-only folders (env/ blob/ host/) by type only.
 *
 * The private stack and the fake servers that tests and benches share live in testing/; bench/ and testing/
 * import nothing from test/. No value imports form a cycle, every source file outside the tests stays short
 * enough to read, and the training iteration (collect → learner update → serve) is written in one workflow file.
 */

export type Rule =
  | 'lib-node-import'
  | 'lib-imports-outside-lib'
  | 'shared-imports-up'
  | 'activities-imports-up'
  | 'workflows-imports-up'
  | 'workflows-value-imports-activities'
  | 'workflows-node-code'
  | 'workers-imports-client'
  | 'bench-imports-test'
  | 'import-cycle'
  | 'file-too-long'
  | 'iteration-loop-twice';

export interface Violation {
  rule: Rule;
  file: string;
  message: string;
}

export const MAX_SOURCE_LINES = 600;

/** Tests may be long (tables of cases); everything else is read and reviewed as a whole. */
function isTestFile(file: string): boolean {
  return file.startsWith('test/') || file.includes('/tests/');
}

/**
 * The three steps of a training iteration, as they read in workflow code: experience collected (child
 * workflows, or an algorithm's `collect`), a learner update, the new adapter served. A workflow file with all
 * three holds an iteration loop.
 */
const LOOP_STEPS: readonly RegExp[] = [/\bexecuteChild\(|\.collect\(/, /\bupdate(Policy|Dpo)\(|\.update\(/, /\bloadAdapterIntoVllm\(/];

/** npm packages lib/ may use: pure code that also runs in the workflow sandbox. */
export const PURE_PACKAGES = ['zod', 'yaml', '@temporalio/common'];

const SHARED_LAYERS = new Set(['env', 'blob', 'host']);
const ABOVE_SHARED = new Set(['activities', 'workflows', 'workers', 'client']);

export interface ImportRef {
  specifier: string;
  /** Erased at compile time: `import type`, `export type`, every named element `type`, `typeof import()`. */
  typeOnly: boolean;
}

/** Every module a file names: static imports and re-exports, `import x = require()`, `require()` and `import()`. */
export function importsOf(fileName: string, text: string): ImportRef[] {
  const source = ts.createSourceFile(fileName, text, ts.ScriptTarget.Latest, false, ts.ScriptKind.TS);
  const refs: ImportRef[] = [];
  const named = (elements: readonly { isTypeOnly: boolean }[] | undefined) => Boolean(elements?.length) && elements!.every((e) => e.isTypeOnly);
  const visit = (node: ts.Node) => {
    if (ts.isImportDeclaration(node) && ts.isStringLiteral(node.moduleSpecifier)) {
      const c = node.importClause;
      const bindings = c?.namedBindings && ts.isNamedImports(c.namedBindings) ? c.namedBindings.elements : undefined;
      const typeOnly = Boolean(c && (c.isTypeOnly || (!c.name && named(bindings))));
      refs.push({ specifier: node.moduleSpecifier.text, typeOnly });
    } else if (ts.isExportDeclaration(node) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) {
      const elements = node.exportClause && ts.isNamedExports(node.exportClause) ? node.exportClause.elements : undefined;
      refs.push({ specifier: node.moduleSpecifier.text, typeOnly: node.isTypeOnly || named(elements) });
    } else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference)) {
      const e = node.moduleReference.expression;
      if (ts.isStringLiteral(e)) refs.push({ specifier: e.text, typeOnly: node.isTypeOnly });
    } else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument) && ts.isStringLiteral(node.argument.literal)) {
      refs.push({ specifier: node.argument.literal.text, typeOnly: true });
    } else if (ts.isCallExpression(node) && node.arguments.length === 1 && ts.isStringLiteral(node.arguments[0])) {
      const callee = node.expression;
      const isDynamicImport = callee.kind === ts.SyntaxKind.ImportKeyword;
      const isRequire = ts.isIdentifier(callee) && callee.text === 'require';
      if (isDynamicImport || isRequire) refs.push({ specifier: node.arguments[0].text, typeOnly: false });
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return refs;
}

const isNodeBuiltin = (spec: string) => spec.startsWith('node:') || builtinModules.includes(spec);
const packageName = (spec: string) =>
  spec
    .split('/')
    .slice(0, spec.startsWith('@') ? 2 : 1)
    .join('/');
const layerOf = (file: string) => (file.includes('/') ? file.split('/')[0] : '');

/** A relative specifier as a repository file (`x.ts` or `x/index.ts`), or undefined outside the given files. */
function resolveRelative(from: string, spec: string, files: ReadonlySet<string>): string | undefined {
  const base = posix.normalize(posix.join(posix.dirname(from), spec));
  const candidates = [base, `${base}.ts`, `${base}.tsx`, `${base}/index.ts`];
  return candidates.find((c) => files.has(c));
}

/** A cycle through every strongly connected component of more than one file (or a file importing itself). */
function cyclesOf(graph: Map<string, string[]>): string[][] {
  let counter = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const components: string[][] = [];
  const strongConnect = (v: string) => {
    index.set(v, counter);
    low.set(v, counter);
    counter++;
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        strongConnect(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v)!, index.get(w)!));
      }
    }
    if (low.get(v) === index.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      components.push(component);
    }
  };
  for (const v of [...graph.keys()].sort()) if (!index.has(v)) strongConnect(v);

  const cycles: string[][] = [];
  for (const component of components) {
    const members = new Set(component);
    const start = [...component].sort()[0];
    const selfLoop = (graph.get(start) ?? []).includes(start);
    if (component.length === 1 && !selfLoop) continue;
    if (selfLoop) {
      cycles.push([start, start]);
      continue;
    }
    // Shortest way back to the start inside the component.
    const previous = new Map<string, string>();
    const queue = [start];
    let found: string | undefined;
    while (queue.length && !found) {
      const v = queue.shift()!;
      for (const w of graph.get(v) ?? []) {
        if (!members.has(w)) continue;
        if (w === start) {
          found = v;
          break;
        }
        if (!previous.has(w)) {
          previous.set(w, v);
          queue.push(w);
        }
      }
    }
    const path = [start];
    for (let v = found; v && v !== start; v = previous.get(v)) path.splice(1, 0, v);
    cycles.push([...path, start]);
  }
  return cycles;
}

/** Every layering violation among the given files (repository-relative paths with `/`, and their text). */
export function checkLayering(sources: ReadonlyMap<string, string>): Violation[] {
  const files = new Set(sources.keys());
  const out: Violation[] = [];
  const valueGraph = new Map<string, string[]>();

  const loops: string[] = [];
  for (const [file, text] of [...sources].sort(([a], [b]) => a.localeCompare(b))) {
    const layer = layerOf(file);
    const lines = text.endsWith('\n') ? text.split('\n').length - 1 : text.split('\n').length;
    if (!isTestFile(file) && lines > MAX_SOURCE_LINES) {
      out.push({ rule: 'file-too-long', file, message: `${file} has ${lines} lines (at most ${MAX_SOURCE_LINES} outside the tests: split it by concern)` });
    }
    if (layer === 'workflows' && LOOP_STEPS.every((step) => step.test(text))) loops.push(file);
    if (!file.endsWith('.ts')) continue;
    const edges: string[] = [];
    valueGraph.set(file, edges);
    for (const { specifier, typeOnly } of importsOf(file, text)) {
      const relative = specifier.startsWith('.');
      const target = relative ? resolveRelative(file, specifier, files) : undefined;
      const targetLayer = relative ? layerOf(target ?? posix.normalize(posix.join(posix.dirname(file), specifier))) : undefined;
      const add = (rule: Rule, why: string) => out.push({ rule, file, message: `${file} imports '${specifier}': ${why}` });

      if (layer === 'lib') {
        if (isNodeBuiltin(specifier)) add('lib-node-import', 'lib/ is pure (Node modules belong in host/)');
        else if (relative && targetLayer !== 'lib') add('lib-imports-outside-lib', `lib/ is the lowest layer and may not import from ${targetLayer || 'the repository root'}/`);
        else if (!relative && !PURE_PACKAGES.includes(packageName(specifier))) {
          add('lib-imports-outside-lib', `lib/ uses only pure packages (${PURE_PACKAGES.join(', ')})`);
        }
      }
      if (SHARED_LAYERS.has(layer) && targetLayer && ABOVE_SHARED.has(targetLayer)) {
        add('shared-imports-up', `${layer}/ sits below ${targetLayer}/`);
      }
      if (layer === 'activities' && (targetLayer === 'workflows' || targetLayer === 'client' || targetLayer === 'workers')) {
        add('activities-imports-up', `activities/ sit below ${targetLayer}/`);
      }
      if (layer === 'workflows' && (targetLayer === 'client' || targetLayer === 'workers')) {
        add('workflows-imports-up', `workflows/ sit below ${targetLayer}/`);
      }
      if (layer === 'workflows' && targetLayer === 'activities' && !typeOnly) {
        add('workflows-value-imports-activities', 'workflow code names activities by type only (`import type`); their code runs in workers');
      }
      if (layer === 'workflows' && !typeOnly && (isNodeBuiltin(specifier) || (targetLayer && SHARED_LAYERS.has(targetLayer)))) {
        add('workflows-node-code', 'workflow code runs in the sandbox, without Node modules (types only)');
      }
      if (layer === 'workers' && targetLayer === 'client') add('workers-imports-client', 'workers/ sit below client/ (shared helpers live in host/)');
      if ((layer === 'bench' || layer === 'testing') && targetLayer === 'test') {
        add('bench-imports-test', `${layer}/ uses no test helpers (what benches share with tests lives in testing/)`);
      }
      if (target && !typeOnly) edges.push(target);
    }
  }
  if (loops.length > 1) {
    out.push({
      rule: 'iteration-loop-twice',
      file: loops[1],
      message: `the training iteration (collect → update → serve) is written in ${loops.join(', ')}: one engine (workflows/train-engine.ts) runs every algorithm`,
    });
  }
  for (const cycle of cyclesOf(valueGraph)) {
    out.push({ rule: 'import-cycle', file: cycle[0], message: `import cycle: ${cycle.join(' → ')}` });
  }
  return out;
}
