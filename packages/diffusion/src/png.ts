/**
 * PNG output through upng-js (2.1.0): 8-bit RGB, lossless, the smallest of upng's row filters, plus
 * text chunks holding the generation parameters (krea2.md §6.5). A text whose characters all fit
 * Latin-1 is a `tEXt` chunk (what A1111 writes and every viewer reads); otherwise an uncompressed
 * `iTXt` (UTF-8), since `tEXt` is Latin-1 only (PNG spec §11.3.4). Files are written under a
 * temporary name and renamed, so an interrupted write leaves nothing behind.
 *
 * Source: PNG (Third Edition) §5.3 chunk layout, §11.3.4 tEXt / iTXt; upng-js UPNG.js `encode`, `decode`.
 */
import { writeAtomically } from "@tp/formats";
import { TpError } from "@tp/tensor";
import UPNG from "upng-js";

/** A decoded PNG: interleaved 8-bit RGB (and RGBA) and its text chunks (tEXt and iTXt, by keyword). */
export interface PngImage {
  readonly width: number;
  readonly height: number;
  /** [height, width, 3] RGB8 (alpha, if any, dropped). */
  readonly rgb: Uint8Array;
  /** [height, width, 4] RGBA8 (255 where the file has no alpha). */
  readonly rgba: Uint8Array;
  readonly text: Readonly<Record<string, string>>;
}

/** Options of {@link encodePng} / {@link writePng}. */
export interface PngOptions {
  /** Text chunks, keyword → text, in order (keywords: 1–79 Latin-1 characters, no NUL). */
  readonly text?: Readonly<Record<string, string>>;
  /** Interleaved channels of the pixel bytes: 3 (RGB, default) or 4 (RGBA, written with its alpha). */
  readonly channels?: 3 | 4;
}

/** CRC-32 (ISO-HDLC, the PNG / zlib polynomial 0xEDB88320), table-driven. */
const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** The CRC-32 of `bytes` as PNG chunks carry it (over type + data). */
export function crc32(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) c = (CRC_TABLE[(c ^ b) & 0xff] as number) ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** One chunk: length, type, data, CRC (PNG §5.3). */
function chunk(type: string, data: Uint8Array): Uint8Array {
  const out = new Uint8Array(12 + data.length);
  const view = new DataView(out.buffer);
  view.setUint32(0, data.length);
  for (let i = 0; i < 4; i++) out[4 + i] = type.charCodeAt(i);
  out.set(data, 8);
  view.setUint32(8 + data.length, crc32(out.subarray(4, 8 + data.length)));
  return out;
}

/** Every character in 1 … 255 (Latin-1 without NUL, what tEXt may hold). */
function isLatin1(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0 || c > 255) return false;
  }
  return true;
}

/** A `tEXt` chunk when `text` is Latin-1, else an uncompressed `iTXt` with UTF-8 text. */
function textChunk(keyword: string, text: string): Uint8Array {
  if (keyword.length < 1 || keyword.length > 79 || !isLatin1(keyword)) {
    throw new TpError("E_ARG", `PNG text keyword must be 1–79 Latin-1 characters, got '${keyword}'`);
  }
  const key = Uint8Array.from(keyword, (c) => c.charCodeAt(0));
  if (isLatin1(text) || text === "") {
    const data = new Uint8Array(key.length + 1 + text.length);
    data.set(key, 0);
    for (let i = 0; i < text.length; i++) data[key.length + 1 + i] = text.charCodeAt(i);
    return chunk("tEXt", data);
  }
  // iTXt: keyword NUL, compression flag 0, method 0, language tag "" NUL, translated keyword "" NUL, UTF-8
  const utf8 = new TextEncoder().encode(text);
  const data = new Uint8Array(key.length + 5 + utf8.length);
  data.set(key, 0);
  data.set(utf8, key.length + 5);
  return chunk("iTXt", data);
}

/**
 * Encode 8-bit RGB (or RGBA with `channels: 4`) as a PNG (depth 8, lossless; upng-js picks the colour
 * type and row filter: RGB when every alpha is 255, else RGBA) with text
 * chunks inserted before the image data.
 * @param rgb    interleaved [height, width, channels] bytes
 * @param width  pixels ≥ 1
 * @param height pixels ≥ 1
 * @returns the PNG file's bytes
 * @throws TpError E_SHAPE when rgb is not width × height × channels bytes; E_ARG for a bad text keyword
 */
export function encodePng(
  rgb: Uint8Array,
  width: number,
  height: number,
  options: PngOptions = {},
): Uint8Array {
  if (!Number.isSafeInteger(width) || !Number.isSafeInteger(height) || width < 1 || height < 1) {
    throw new TpError("E_SHAPE", `PNG size must be positive integers, got ${width}x${height}`);
  }
  const channels = options.channels ?? 3;
  if ((channels !== 3 && channels !== 4) || rgb.length !== width * height * channels) {
    throw new TpError(
      "E_SHAPE",
      `PNG: ${rgb.length} bytes is not ${width} × ${height} × ${channels} (${channels === 4 ? "RGBA8" : "RGB8"})`,
    );
  }
  const texts = Object.entries(options.text ?? {}).map(([k, v]) => textChunk(k, v));
  // its own buffer either way: upng reads the whole ArrayBuffer
  const rgba = new Uint8Array(width * height * 4);
  if (channels === 4) rgba.set(rgb);
  else {
    for (let i = 0, j = 0; i < rgb.length; i += 3, j += 4) {
      rgba[j] = rgb[i] as number;
      rgba[j + 1] = rgb[i + 1] as number;
      rgba[j + 2] = rgb[i + 2] as number;
      rgba[j + 3] = 255;
    }
  }
  // cnum 0: lossless; forbidPlte: never a palette (upng would add a tRNS chunk to palette images).
  const encode = UPNG.encode as (
    imgs: ArrayBuffer[],
    w: number,
    h: number,
    cnum: number,
    dels?: number[],
    forbidPlte?: boolean,
  ) => ArrayBuffer;
  const png = new Uint8Array(encode([rgba.buffer], width, height, 0, undefined, true));
  // Insert the text chunks before the first IDAT (after IHDR and upng's sRGB chunk).
  const view = new DataView(png.buffer);
  let at = 8;
  while (at + 8 <= png.length) {
    const type = String.fromCharCode(...png.subarray(at + 4, at + 8));
    if (type === "IDAT") break;
    at += 12 + view.getUint32(at);
  }
  const extra = texts.reduce((n, t) => n + t.length, 0);
  const out = new Uint8Array(png.length + extra);
  out.set(png.subarray(0, at), 0);
  let o = at;
  for (const t of texts) {
    out.set(t, o);
    o += t.length;
  }
  out.set(png.subarray(at), o);
  return out;
}

/**
 * {@link encodePng} written to `path` through a temporary name in the same folder, then renamed.
 * @throws TpError as {@link encodePng}; E_IO when the file cannot be written (nothing is left behind)
 */
export function writePng(
  path: string,
  rgb: Uint8Array,
  width: number,
  height: number,
  options: PngOptions = {},
): void {
  const bytes = encodePng(rgb, width, height, options);
  writeAtomically(path, (write) => write(bytes));
}

/**
 * Decode a PNG (any colour type upng-js reads) to RGB8 and its `tEXt` / `iTXt` texts.
 * @throws TpError E_FORMAT when the bytes are not a PNG
 */
export function decodePng(bytes: Uint8Array): PngImage {
  const sig = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
  if (bytes.length < 8 || sig.some((b, i) => bytes[i] !== b)) {
    throw new TpError("E_FORMAT", "not a PNG file (bad signature)");
  }
  const ab = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) as ArrayBuffer;
  const img = UPNG.decode(ab);
  const rgba = new Uint8Array(UPNG.toRGBA8(img)[0] as ArrayBuffer);
  const n = img.width * img.height;
  const rgb = new Uint8Array(n * 3);
  for (let i = 0; i < n; i++) {
    rgb[i * 3] = rgba[i * 4] as number;
    rgb[i * 3 + 1] = rgba[i * 4 + 1] as number;
    rgb[i * 3 + 2] = rgba[i * 4 + 2] as number;
  }
  return { width: img.width, height: img.height, rgb, rgba, text: { ...img.tabs.tEXt, ...img.tabs.iTXt } };
}
