import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import GithubSlugger from 'github-slugger';

/** The text outside fenced code blocks, line by line (a `#` or a `](` inside a code sample is not Markdown). */
function proseLines(markdown: string): string[] {
  let fenced = false;
  const out: string[] = [];
  for (const line of markdown.split('\n')) {
    if (line.trimStart().startsWith('```')) fenced = !fenced;
    else if (!fenced) out.push(line);
  }
  return out;
}

/** The anchors GitHub gives a file's headings (a repeated heading gets `-1`, `-2`, … as there). */
export function headingAnchors(markdown: string): Set<string> {
  const slugger = new GithubSlugger();
  const anchors = new Set<string>();
  for (const line of proseLines(markdown)) {
    const m = /^#{1,6} (.+)$/.exec(line);
    if (m) anchors.add(slugger.slug(m[1].replace(/`/g, '').trim()));
  }
  return anchors;
}

/** The targets of a file's inline links, code spans left out (`[text](target)` in backticks is an example, not a link). */
export function linkTargets(markdown: string): string[] {
  const targets: string[] = [];
  for (const line of proseLines(markdown)) {
    for (const m of line.replace(/`[^`]*`/g, '``').matchAll(/\]\(([^)\s]+)\)/g)) targets.push(m[1]);
  }
  return targets;
}

/** Links of `files` (repository-relative Markdown paths) to a file that is missing or to a heading it lacks; web links are not followed. */
export function brokenLinks(root: string, files: string[]): string[] {
  const problems: string[] = [];
  const anchorsOf = new Map<string, Set<string>>();
  const anchors = (path: string) => {
    if (!anchorsOf.has(path)) anchorsOf.set(path, headingAnchors(readFileSync(join(root, path), 'utf8')));
    return anchorsOf.get(path)!;
  };
  for (const file of files) {
    for (const target of linkTargets(readFileSync(join(root, file), 'utf8'))) {
      if (/^[a-z][a-z+.-]*:/i.test(target)) continue;
      const [path, anchor] = target.split('#', 2);
      const resolved = path ? normalize(join(dirname(file), path)) : file;
      if (relative(root, join(root, resolved)).startsWith('..') || !existsSync(join(root, resolved))) {
        problems.push(`${file}: ${target}: no file ${resolved}`);
      } else if (anchor !== undefined && resolved.endsWith('.md') && !anchors(resolved).has(anchor)) {
        problems.push(`${file}: ${target}: ${resolved} has no heading with anchor #${anchor}`);
      }
    }
  }
  return problems;
}
