// How long workers get to stop: read by the workers and by `halo down`, which must not load the worker SDK for it.

/**
 * How a worker shuts down on SIGTERM: running activities are cancelled after `graceMs` and abandoned at
 * `forceMs`, so a shutdown never hangs on an activity that ignores its cancellation.
 */
export const WORKER_SHUTDOWN = { graceMs: 10_000, forceMs: 25_000 } as const;
/**
 * How long `halo down` (and an upgrade's restart) waits for a worker before SIGKILL: past the SDK's forced
 * shutdown, with room for the worker's own cleanup after it (browser sessions, the MiniWoB++ server).
 */
export const WORKER_STOP_GRACE_MS = WORKER_SHUTDOWN.forceMs + 15_000;
