// Every workflow the control worker runs. Workflow code is deterministic: no I/O, no clocks, no Node APIs.
export { episode, episodeProgressQuery } from './episode';
export { learnerContract } from './learner-contract';
export { trainGrpo, trainStatusQuery, pauseSignal, resumeSignal, stopSignal } from './train-grpo';
export { evaluate } from './evaluate';
export { mctsSearch, trainMcts, mctsTreeQuery, mctsProgressQuery, trainMctsStatusQuery } from './mcts';
