import { loadDotEnv } from './env-file';

// Imported first by the CLI and the workers: `.env` of the repository root fills in what the environment
// does not set.
loadDotEnv();
