/** Runs `f` with the environment variables `vars` set (undefined: unset), and puts back what was there after. */
export async function withEnv(vars: Record<string, string | undefined>, f: () => Promise<void>): Promise<void> {
  const before = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  const apply = (values: Record<string, string | undefined>) => {
    for (const [k, v] of Object.entries(values))
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
  };
  apply(vars);
  try {
    await f();
  } finally {
    apply(before);
  }
}
