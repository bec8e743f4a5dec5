#!/usr/bin/env node
// Runs the TypeScript CLI through tsx so the repository needs no separate build step.
require('tsx/cjs');
require('../client/cli.ts');
