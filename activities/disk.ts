import { statfs } from 'node:fs/promises';

export interface FreeDiskResult {
  /** The folder checked (this worker's home: blobs, metrics, trajectories). */
  path: string;
  freeBytes: number;
  minFreeBytes: number;
  ok: boolean;
}

/** Free space on the disk of the control worker's home folder, before an iteration writes to it. */
export function createDiskActivities(home: string) {
  return {
    async checkFreeDisk(input: { minFreeBytes: number }): Promise<FreeDiskResult> {
      const st = await statfs(home);
      const freeBytes = Number(st.bavail) * Number(st.bsize);
      return { path: home, freeBytes, minFreeBytes: input.minFreeBytes, ok: freeBytes >= input.minFreeBytes };
    },
  };
}

export type DiskActivities = ReturnType<typeof createDiskActivities>;
