// A tiny PNG reader: validates the structure of a PNG file (signature, chunk lengths and CRCs, IHDR first,
// IDAT present, IEND last) and returns its header. No decoding of pixels; no I/O, but Node Buffers (so host/, not lib/).

export const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

export interface PngInfo {
  width: number;
  height: number;
  bitDepth: number;
  colorType: number;
  /** Chunk types in file order (IHDR, ..., IEND). */
  chunks: string[];
}

let crcTable: Uint32Array | undefined;

/** CRC-32 (ISO 3309), as PNG chunks use it. */
export function crc32(bytes: Uint8Array): number {
  if (!crcTable) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let c = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) c = crcTable[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

export class PngError extends Error {
  constructor(message: string) {
    super(`not a valid PNG: ${message}`);
    this.name = 'PngError';
  }
}

/** Width/height only, from the IHDR (fast; no CRC walk). Throws PngError when the header is not a PNG's. */
export function pngSize(buf: Buffer): { width: number; height: number } {
  if (buf.length < 24 || !buf.subarray(0, 8).equals(PNG_SIGNATURE)) throw new PngError('bad signature');
  if (buf.toString('latin1', 12, 16) !== 'IHDR') throw new PngError('first chunk is not IHDR');
  return { width: buf.readUInt32BE(16), height: buf.readUInt32BE(20) };
}

/** Walks every chunk and checks its CRC; throws PngError naming the first problem. */
export function pngInfo(buf: Buffer): PngInfo {
  if (buf.length < 8 || !buf.subarray(0, 8).equals(PNG_SIGNATURE)) throw new PngError('bad signature');
  const chunks: string[] = [];
  let off = 8;
  let header: Omit<PngInfo, 'chunks'> | undefined;
  while (off < buf.length) {
    if (off + 12 > buf.length) throw new PngError(`truncated chunk at byte ${off}`);
    const len = buf.readUInt32BE(off);
    const type = buf.toString('latin1', off + 4, off + 8);
    if (!/^[A-Za-z]{4}$/.test(type)) throw new PngError(`bad chunk type at byte ${off}`);
    const end = off + 12 + len;
    if (end > buf.length) throw new PngError(`chunk ${type} runs past the end of the file`);
    const crc = buf.readUInt32BE(off + 8 + len);
    if (crc32(buf.subarray(off + 4, off + 8 + len)) !== crc) throw new PngError(`CRC mismatch in chunk ${type}`);
    if (chunks.length === 0) {
      if (type !== 'IHDR' || len !== 13) throw new PngError('first chunk is not a 13-byte IHDR');
      header = {
        width: buf.readUInt32BE(off + 8),
        height: buf.readUInt32BE(off + 12),
        bitDepth: buf[off + 16],
        colorType: buf[off + 17],
      };
      if (header.width === 0 || header.height === 0) throw new PngError('zero width or height');
    }
    chunks.push(type);
    off = end;
    if (type === 'IEND') break;
  }
  if (!header) throw new PngError('no IHDR');
  if (!chunks.includes('IDAT')) throw new PngError('no IDAT chunk');
  if (chunks[chunks.length - 1] !== 'IEND') throw new PngError('no IEND chunk');
  return { ...header, chunks };
}

/** True when `buf` is a structurally valid PNG. */
export function isValidPng(buf: Buffer): boolean {
  try {
    pngInfo(buf);
    return true;
  } catch {
    return false;
  }
}
