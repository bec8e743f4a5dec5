// Every workflow the control worker runs. Workflow code is deterministic: no I/O, no clocks, no Node APIs.
export { episode, episodeProgressQuery } from './episode';
export { trainGrpo } from './train-grpo';
export { trainMcts } from './train-mcts';
export { mctsSearch, mctsTreeQuery, mctsProgressQuery } from './mcts-search';
export { evaluate, evalProgressQuery } from './evaluate';
export { pauseSignal, pauseUpdate, resumeSignal, resumeUpdate, stopSignal, stopUpdate, statusQuery } from './messages';
