/** One element line of an observation's accessibility tree: `[id] role "name" … @(x,y)`. */
export interface AxLine {
  id: number;
  role: string;
  /** The quoted name, unescaped; '' when the line has none. */
  name: string;
  line: string;
  /** The element's centre in grid coordinates, when the line ends with it. */
  x?: number;
  y?: number;
}

/** The element lines of an accessibility tree (other lines are left out). */
export function parseAxtree(axtree: string): AxLine[] {
  const out: AxLine[] = [];
  for (const line of axtree.split('\n')) {
    const m = /^\[(\d+)\] (\S+)(?: ("(?:[^"\\]|\\.)*"))?/.exec(line);
    if (!m) continue;
    const at = / @\((\d+),(\d+)\)$/.exec(line);
    out.push({ id: Number(m[1]), role: m[2], name: m[3] ? (JSON.parse(m[3]) as string) : '', line, ...(at ? { x: Number(at[1]), y: Number(at[2]) } : {}) });
  }
  return out;
}

/** The elements a click can aim at: those whose line gives their coordinates. */
export function clickableElements(axtree: string): Required<AxLine>[] {
  return parseAxtree(axtree).filter((l): l is Required<AxLine> => l.x !== undefined && l.y !== undefined);
}
