/**
 * The workflow clock in milliseconds: in workflow code `Date` is Temporal's, the time of the current workflow
 * task as recorded in the history, so phase timings replay to the same values. Only for durations shown in
 * metrics and the UI; never for decisions.
 */
export function workflowClockMs(): number {
  return Date.now();
}
