import type { Action } from '../lib/model-io/actions';
import type { LivedState } from '../lib/episode/episode-types';
import { workflowClockMs } from './clock';
import { type DurableSession, type OpenAt, Sessions, type SessionSettings } from './durable-session';
import type { SearchState } from './search-state';

/**
 * Sessions whose every opening (a restore, or a rebuild after a lost session) is timed and counted, and
 * when each one's episode began (parked sessions past their episode's time limit are only reset).
 */
export class SearchSessions extends Sessions {
  private readonly begun = new Map<string, number>();

  constructor(
    settings: SessionSettings,
    private readonly state: SearchState,
  ) {
    super(settings);
  }

  override async open(path: readonly Action[], episodeId: string, summary: string, at: OpenAt = {}): Promise<DurableSession> {
    const t0 = workflowClockMs();
    const s = await this.state.timed('restore', () => super.open(path, episodeId, summary, at));
    this.began(s, t0);
    this.state.restored((this.settings.base?.length ?? 0) + path.length, s.observation.goal);
    return s;
  }

  /** A new session opened in the background, not for this simulation: not a restore of it. */
  async openSpare(path: readonly Action[], episodeId: string, summary: string, lived?: LivedState): Promise<DurableSession> {
    const t0 = workflowClockMs();
    const s = await super.open(path, episodeId, summary, { lived });
    this.began(s, t0);
    return s;
  }

  began(s: DurableSession, at: number): void {
    this.begun.set(s.handle.sessionId, at);
  }

  /** When the session's episode began; a session not seen here counts as too old to use as it is. */
  begunAt(s: DurableSession): number {
    return this.begun.get(s.handle.sessionId) ?? -Infinity;
  }
}
