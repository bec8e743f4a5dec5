import { createReadStream, existsSync, type Stats } from 'node:fs';
import { stat } from 'node:fs/promises';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { extname, join, resolve, sep } from 'node:path';
import { locateWithProjectPython, NOT_INSTALLED_STATUS } from './project-python';

const INSTALL_HINT = 'pip install miniwob==1.1.0 into .venv; ./launch.sh does it';

// find_spec on a top-level package locates it without executing its __init__ (which imports gymnasium).
const FIND_SPEC_SCRIPT = [
  'import importlib.util, os, sys',
  "s = importlib.util.find_spec('miniwob')",
  `if s is None or not s.submodule_search_locations: sys.exit(${NOT_INSTALLED_STATUS})`,
  "print(os.path.join(list(s.submodule_search_locations)[0], 'html'))",
].join('\n');

let cachedHtmlDir: string | undefined;

function looksLikeMiniwobHtml(dir: string): boolean {
  return existsSync(join(dir, 'miniwob')) && existsSync(join(dir, 'core', 'core.js'));
}

/**
 * The `html/` folder of the installed `miniwob` Python package: HALO_MINIWOB_HTML, else asked from
 * <repo>/.venv/bin/python (fallback python3) without importing the package.
 */
export function findMiniwobHtml(): string {
  const fromEnv = process.env.HALO_MINIWOB_HTML;
  if (fromEnv) {
    const dir = resolve(fromEnv);
    if (!looksLikeMiniwobHtml(dir)) {
      throw new Error(`HALO_MINIWOB_HTML=${fromEnv} is not a MiniWoB html folder (no miniwob/ and core/core.js)`);
    }
    return dir;
  }
  if (cachedHtmlDir) return cachedHtmlDir;
  cachedHtmlDir = locateWithProjectPython(
    'miniwob',
    FIND_SPEC_SCRIPT,
    (out) => {
      if (!out || !looksLikeMiniwobHtml(out)) throw new Error(`${out || 'no output'} is not a MiniWoB html folder`);
      return out;
    },
    INSTALL_HINT,
  );
  return cachedHtmlDir;
}

const CONTENT_TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.htm': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json; charset=utf-8',
  '.txt': 'text/plain; charset=utf-8',
  '.png': 'image/png',
  '.gif': 'image/gif',
  '.jpg': 'image/jpeg',
  '.jpeg': 'image/jpeg',
  '.svg': 'image/svg+xml',
  '.ico': 'image/x-icon',
  '.webp': 'image/webp',
  '.woff': 'font/woff',
  '.woff2': 'font/woff2',
  '.ttf': 'font/ttf',
  '.otf': 'font/otf',
  '.eot': 'application/vnd.ms-fontobject',
  '.map': 'application/json; charset=utf-8',
};

export interface MiniwobServer {
  /** e.g. http://127.0.0.1:41234 ; task pages are at `${baseUrl}/miniwob/<task>.html`. */
  baseUrl: string;
  port: number;
  /** The folder being served. */
  root: string;
  close(): Promise<void>;
}

export interface StartMiniwobServerOptions {
  /** 0 (default) picks a free port. */
  port?: number;
  host?: string;
  /** Folder to serve; default findMiniwobHtml(). */
  root?: string;
}

function send(res: ServerResponse, status: number, text: string): void {
  res.writeHead(status, { 'Content-Type': 'text/plain; charset=utf-8', 'Content-Length': Buffer.byteLength(text) });
  res.end(text);
}

/**
 * Maps a raw request target to a file under root, or to an HTTP status. The raw target is checked before
 * any normalisation, so `/../x` and `/%2e%2e/x` are refused (403) instead of being silently folded back.
 */
export function resolveRequestPath(root: string, rawUrl: string): { path: string } | { status: 400 | 403 } {
  const pathPart = rawUrl.split(/[?#]/, 1)[0] ?? '';
  let decoded: string;
  try {
    decoded = decodeURIComponent(pathPart);
  } catch {
    return { status: 400 };
  }
  if (!decoded.startsWith('/') || decoded.includes('\0') || decoded.includes('\\')) return { status: 403 };
  const segments = decoded.split('/');
  if (segments.some((s) => s === '..' || s === '.')) return { status: 403 };
  const full = resolve(join(root, decoded));
  if (full !== root && !full.startsWith(root + sep)) return { status: 403 };
  return { path: full };
}

/** A small static file server for the MiniWoB html folder (no directory listing, no traversal). */
export async function startMiniwobServer(opts: StartMiniwobServerOptions = {}): Promise<MiniwobServer> {
  const root = resolve(opts.root ?? findMiniwobHtml());
  const host = opts.host ?? '127.0.0.1';

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('Allow', 'GET, HEAD');
      send(res, 405, 'method not allowed');
      return;
    }
    const target = resolveRequestPath(root, req.url ?? '/');
    if ('status' in target) {
      send(res, target.status, target.status === 403 ? 'forbidden' : 'bad request');
      return;
    }
    let info: Stats;
    try {
      info = await stat(target.path);
    } catch {
      send(res, 404, 'not found');
      return;
    }
    if (!info.isFile()) {
      send(res, 404, 'not found');
      return;
    }
    res.writeHead(200, {
      'Content-Type': CONTENT_TYPES[extname(target.path).toLowerCase()] ?? 'application/octet-stream',
      'Content-Length': info.size,
      // The files are an installed package: immutable for the life of the server.
      'Cache-Control': 'public, max-age=3600',
    });
    if (req.method === 'HEAD') {
      res.end();
      return;
    }
    const stream = createReadStream(target.path);
    stream.on('error', () => res.destroy());
    stream.pipe(res);
  };

  const server = createServer((req, res) => {
    handle(req, res).catch(() => {
      if (!res.headersSent) send(res, 500, 'internal error');
      else res.destroy();
    });
  });

  await new Promise<void>((ok, fail) => {
    server.once('error', fail);
    server.listen(opts.port ?? 0, host, () => {
      server.off('error', fail);
      ok();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const hostInUrl = host.includes(':') ? `[${host}]` : host;
  return {
    baseUrl: `http://${hostInUrl}:${port}`,
    port,
    root,
    close: () =>
      new Promise<void>((ok) => {
        server.close(() => ok());
        server.closeAllConnections();
      }),
  };
}
