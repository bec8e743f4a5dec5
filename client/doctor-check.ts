// One row of `halo doctor`: what was checked, how it went, and what to do when it did not pass.

export type CheckStatus = 'pass' | 'warn' | 'fail' | 'skip';

export interface DoctorCheck {
  /** Stable identifier (`temporal`, `worker.browser`, …), for scripts and tests. */
  id: string;
  name: string;
  status: CheckStatus;
  detail: string;
  /** What to do about a fail, warn or skip. */
  fix?: string;
}
