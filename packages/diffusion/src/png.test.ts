// PNG output: encode with upng-js plus our text chunks, decode back with upng-js (pixels and texts), and
// walk the chunks by hand (order, CRCs against node:zlib's crc32, colour type) so a reader other than
// upng would accept the file too.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { crc32 as zlibCrc32 } from "node:zlib";
import { isTpError } from "@tp/tensor";
import { crc32, decodePng, encodePng, writePng } from "./png.ts";

const tmp = mkdtempSync(join(tmpdir(), "tp-png-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** Deterministic RGB8 test pattern: gradients plus a hash, > 256 colours (no palette possible). */
function pattern(w: number, h: number): Uint8Array {
  const rgb = new Uint8Array(w * h * 3);
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const i = (y * w + x) * 3;
      rgb[i] = (x * 255) / (w - 1);
      rgb[i + 1] = (y * 255) / (h - 1);
      rgb[i + 2] = (Math.imul(x + 1, 2654435761) ^ Math.imul(y + 7, 40503)) & 255;
    }
  }
  return rgb;
}

/** Chunks of a PNG: type, data, and whether its CRC matches zlib's. */
function chunks(png: Uint8Array): { type: string; data: Uint8Array; crcOk: boolean }[] {
  const out = [];
  const v = new DataView(png.buffer, png.byteOffset, png.byteLength);
  for (let at = 8; at < png.length; ) {
    const n = v.getUint32(at);
    const type = String.fromCharCode(...png.subarray(at + 4, at + 8));
    const data = png.subarray(at + 8, at + 8 + n);
    const crcOk = v.getUint32(at + 8 + n) === zlibCrc32(png.subarray(at + 4, at + 8 + n));
    out.push({ type, data, crcOk });
    at += 12 + n;
  }
  return out;
}

test("RGB8 round trip through upng-js with tEXt parameters and an iTXt for non-Latin-1 text", () => {
  const w = 67;
  const h = 45;
  const rgb = pattern(w, h);
  const parameters = "a café at night\nSteps: 8, Sampler: Euler, CFG scale: 1.0, Seed: 0, Size: 67x45";
  const png = encodePng(rgb, w, h, { text: { parameters, prompt_ja: "夜のカフェ" } });
  const back = decodePng(png);
  expect([back.width, back.height]).toEqual([w, h]);
  expect(back.rgb).toEqual(rgb);
  expect(back.text).toEqual({ parameters, prompt_ja: "夜のカフェ" });

  const cs = chunks(png);
  expect(cs.map((c) => c.type)).toEqual(["IHDR", "sRGB", "tEXt", "iTXt", "IDAT", "IEND"]);
  expect(cs.every((c) => c.crcOk)).toBe(true);
  const hdr = cs[0]?.data as Uint8Array;
  const ihdr = new DataView(hdr.buffer, hdr.byteOffset);
  expect([ihdr.getUint32(0), ihdr.getUint32(4), hdr[8], hdr[9]]).toEqual([w, h, 8, 2]); // RGB, 8 bits
  // tEXt is keyword NUL Latin-1 text (é is one byte, 0xE9)
  const t = cs[2]?.data as Uint8Array;
  expect(new TextDecoder("latin1").decode(t)).toBe(`parameters\0${parameters}`);
  expect(t.includes(0xe9)).toBe(true);
});

test("few colours stay RGB (no palette, no tRNS); crc32 is zlib's", () => {
  const rgb = new Uint8Array(16 * 16 * 3).fill(200);
  const png = encodePng(rgb, 16, 16);
  expect(chunks(png).map((c) => c.type)).toEqual(["IHDR", "sRGB", "IDAT", "IEND"]);
  expect(chunks(png)[0]?.data[9]).toBe(2);
  expect(decodePng(png).rgb).toEqual(rgb);
  for (const s of ["", "IEND", "123456789"]) {
    const b = new TextEncoder().encode(s);
    expect(crc32(b)).toBe(zlibCrc32(b));
  }
});

test("writePng writes through a temporary name; errors leave nothing", () => {
  const path = join(tmp, "out.png");
  const rgb = pattern(8, 4);
  writePng(path, rgb, 8, 4, { text: { parameters: "p" } });
  expect(decodePng(new Uint8Array(readFileSync(path))).text.parameters).toBe("p");
  expect(readdirSync(tmp)).toEqual(["out.png"]);
  const code = (f: () => unknown) => {
    try {
      f();
    } catch (e) {
      return isTpError(e) ? `${e.code}: ${e.message}` : String(e);
    }
    return "ok";
  };
  expect(code(() => writePng(join(tmp, "bad.png"), rgb, 8, 5))).toBe(
    "E_SHAPE: PNG: 96 bytes is not 8 × 5 × 3 (RGB8)",
  );
  expect(code(() => writePng(join(tmp, "k.png"), rgb, 8, 4, { text: { "": "x" } }))).toStartWith(
    "E_ARG: PNG text keyword must be 1–79 Latin-1 characters",
  );
  expect(code(() => writePng(join(tmp, "no-such-dir", "x.png"), rgb, 8, 4))).toStartWith("E_IO:");
  expect(readdirSync(tmp)).toEqual(["out.png"]);
  expect(existsSync(join(tmp, "no-such-dir"))).toBe(false);
  expect(code(() => decodePng(new Uint8Array([1, 2, 3])))).toBe("E_FORMAT: not a PNG file (bad signature)");
});

describe("RGBA PNG", () => {
  test("alpha round-trips; RGB stays colour type 2", () => {
    const w = 3;
    const h = 2;
    const rgba = Uint8Array.from({ length: w * h * 4 }, (_, i) => (i * 37 + 11) % 256);
    const png = encodePng(rgba, w, h, { channels: 4, text: { parameters: "p" } });
    expect(png[25]).toBe(6); // IHDR colour type: RGBA
    const back = decodePng(png);
    expect(Array.from(back.rgba)).toEqual(Array.from(rgba));
    expect(back.text.parameters).toBe("p");
    const rgb = Uint8Array.from({ length: w * h * 3 }, (_, i) => i);
    expect(
      decodePng(encodePng(rgb, w, h))
        .rgba.filter((_, i) => i % 4 === 3)
        .every((a) => a === 255),
    ).toBe(true);
    expect(() => encodePng(rgb, w, h, { channels: 4 })).toThrow("RGBA8");
  });
});
