/**
 * The workflow clock in milliseconds: in workflow code `Date` is Temporal's, the time of the current workflow
 * task as recorded in the history, so phase timings replay to the same values. Only for durations shown in
 * metrics and the UI; never for decisions.
 */
export function workflowClockMs(): number {
  // biome-ignore lint/complexity/useDateNow: the sandbox's Date is the workflow task's recorded time; written as a Date so no reader mistakes it for the host clock
  return new Date().getTime();
}
