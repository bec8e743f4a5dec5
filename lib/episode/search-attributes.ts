import { defineSearchAttributeKey, SearchAttributeType } from '@temporalio/common';

// Registered on the namespace by `halo up`; used by workflows (upsert) and the CLI (list filters).
export const RUN_ID = defineSearchAttributeKey('HaloRunId', SearchAttributeType.KEYWORD);
export const TASK = defineSearchAttributeKey('HaloTask', SearchAttributeType.KEYWORD);
export const MODE = defineSearchAttributeKey('HaloMode', SearchAttributeType.KEYWORD);
export const KIND = defineSearchAttributeKey('HaloKind', SearchAttributeType.KEYWORD);

export const ALL_SEARCH_ATTRIBUTES = [RUN_ID, TASK, MODE, KIND];
