import pino from 'pino';

// Structured logs; anything that looks like a credential is redacted before it is written.
export const REDACT_PATHS = [
  'apiKey',
  '*.apiKey',
  'api_key',
  '*.api_key',
  'authorization',
  '*.authorization',
  'headers.authorization',
  '*.headers.authorization',
  'password',
  '*.password',
];

export function createLogger(name: string, level = process.env.HALO_LOG_LEVEL ?? 'info') {
  return pino({ name, level, redact: { paths: REDACT_PATHS, censor: '[redacted]' } });
}
export type Logger = ReturnType<typeof createLogger>;
