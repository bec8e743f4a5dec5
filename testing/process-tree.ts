import { readdirSync, readFileSync } from 'node:fs';

/** One row of /proc: a process's parent and its CPU-seconds so far (user + system, at USER_HZ 100). */
interface ProcRow {
  ppid: number;
  cpuSeconds: number;
}

/** Every process /proc lists now; one that exits while it is read is left out. */
function processTable(): Map<number, ProcRow> {
  const rows = new Map<number, ProcRow>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${d}/stat`, 'utf8');
    } catch {
      continue;
    }
    // The command name (field 2) may hold spaces and parentheses: the fields after it start past the last ')'.
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    rows.set(Number(d), { ppid: Number(f[1]), cpuSeconds: (Number(f[11]) + Number(f[12])) / 100 });
  }
  return rows;
}

/** Every process below `root` (children, their children…), not `root` itself. */
export function descendants(root: number): number[] {
  const children = new Map<number, number[]>();
  for (const [pid, { ppid }] of processTable()) children.set(ppid, [...(children.get(ppid) ?? []), pid]);
  const out: number[] = [];
  const todo = [root];
  while (todo.length) {
    const kids = children.get(todo.pop() as number) ?? [];
    out.push(...kids);
    todo.push(...kids);
  }
  return out;
}

/** CPU-seconds of `root` and every process below it. */
export function treeCpuSeconds(root: number): number {
  const table = processTable();
  return [root, ...descendants(root)].reduce((sum, pid) => sum + (table.get(pid)?.cpuSeconds ?? 0), 0);
}

/** The command line of `pid`, its arguments joined by spaces; undefined once it has exited or cannot be read. */
export function cmdline(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim();
  } catch {
    return undefined;
  }
}
