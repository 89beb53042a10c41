#!/usr/bin/env node
// idrange public-ID tokens (Go package publicid) in Node.js, standard library
// only (node:crypto): decode the tokens a Go service hands out, or make them.
// docs/public-ids.md states the construction; this file follows it line by
// line, and the known-answer vectors (publicid/testdata/vectors.json) check
// that it agrees with Go.
//
//   node publicid.mjs vectors FILE                            check every vector of FILE
//   node publicid.mjs encode --keys FILE --kind KIND ID...    print one token per ID
//   node publicid.mjs decode --keys FILE --kind KIND TOKEN... print one ID per token
//
// FILE for --keys is the key file `rangesvc token keygen` writes. IDs are
// decimal int64 (BigInt here: a JavaScript number loses precision above
// 2^53). Exit status: 0 done, 1 a token or vector failed (each named on
// stderr, nothing on stdout), 2 bad usage. Needs Node.js 16 or later.
//
// As a module: import { parseKeyFile, Codec, TokenError } from './publicid.mjs'.

import { createCipheriv, createDecipheriv, hkdfSync, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { argv, exit, stderr, stdout } from 'node:process';
import { pathToFileURL } from 'node:url';

const ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'; // base64url
const MAX_KEY_ID = 61; // a key id is one letter or digit: ALPHABET[0..61]
const KEY_SIZE = 32;
const KDF_INFO = 'idrange publicid v1\0';
const KIND = /^[A-Za-z0-9._-]{1,64}$/;
// The only spelling of a token: a key id, 21 base64url characters, and a
// last one whose unused low 4 bits are zero (A, Q, g or w). Buffer's own
// base64url decoder skips characters it does not know, so this check
// comes first.
const TOKEN = /^[A-Za-z0-9][A-Za-z0-9_-]{21}[AQgw]$/;
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

/** A token that does not decode; .reason is the Go sentinel's name. */
export class TokenError extends Error {
  constructor(reason, message) {
    super(`${message}: ${reason}`);
    this.reason = reason; // 'malformed', 'unknown key' or 'not authentic'
  }
}

/**
 * Reads the key file format: "key ID SECRET" lines (SECRET: 32 bytes in
 * standard base64), one "primary ID" line, # comments. Throws on anything
 * else, naming the line (never the secret).
 */
export function parseKeyFile(text) {
  const keys = new Map();
  let primary = -1;
  text.split('\n').forEach((line, i) => {
    const f = line.trim().split(/\s+/).filter(Boolean);
    const where = `line ${i + 1}`;
    if (f.length === 0 || f[0].startsWith('#')) return;
    const keyID = (s) => {
      if (!/^(0|[1-9][0-9]?)$/.test(s) || Number(s) > MAX_KEY_ID) throw new Error(`${where}: key id is not a number in 0..${MAX_KEY_ID}`);
      return Number(s);
    };
    if (f[0] === 'key' && f.length === 3) {
      const id = keyID(f[1]);
      const secret = Buffer.from(f[2], 'base64');
      if (secret.length !== KEY_SIZE || secret.toString('base64') !== f[2]) throw new Error(`${where}: key ${id}: secret is not ${KEY_SIZE} bytes of standard base64`);
      if (keys.has(id)) throw new Error(`${where}: key ${id} given twice`);
      keys.set(id, secret);
    } else if (f[0] === 'primary' && f.length === 2) {
      if (primary >= 0) throw new Error(`${where}: a second primary line`);
      primary = keyID(f[1]);
    } else {
      throw new Error(`${where}: not a key line, a primary line or a # comment`);
    }
  });
  if (keys.size === 0) throw new Error('no keys');
  if (!keys.has(primary)) throw new Error('no primary line, or its key is not listed');
  return { primary, keys };
}

/** One AES-256 block, either way. */
function aes256(key, block, decrypt) {
  const c = (decrypt ? createDecipheriv : createCipheriv)('aes-256-ecb', key, null);
  c.setAutoPadding(false);
  return Buffer.concat([c.update(block), c.final()]);
}

/** Encodes and decodes the tokens of one kind under a key set. */
export class Codec {
  /** keys: Map of key id -> 32-byte secret; primary: the id that encodes. */
  constructor(keys, primary, kind) {
    if (!KIND.test(kind)) throw new Error(`kind ${JSON.stringify(kind)}: want 1..64 ASCII letters, digits, '.', '_' or '-'`);
    if (!keys.has(primary)) throw new Error(`primary key ${primary} is not one of the keys`);
    this.kind = kind;
    this.primary = primary;
    this.derived = new Map(); // key id -> { aesKey, check }
    for (const [id, secret] of keys) {
      // HKDF-SHA256, empty salt, info "idrange publicid v1" 0x00 kind, 40 bytes.
      const okm = Buffer.from(hkdfSync('sha256', secret, Buffer.alloc(0), KDF_INFO + kind, 40));
      this.derived.set(id, { aesKey: okm.subarray(0, 32), check: okm.subarray(32, 40) });
    }
  }

  /** The token of id (a BigInt in the int64 range) under the primary key. */
  encode(id) {
    if (typeof id !== 'bigint' || id < INT64_MIN || id > INT64_MAX) throw new Error(`${id}: not an int64 BigInt`);
    const { aesKey, check } = this.derived.get(this.primary);
    const block = Buffer.alloc(16);
    block.writeBigInt64BE(id, 0); // two's complement, big-endian
    check.copy(block, 8);
    return ALPHABET[this.primary] + aes256(aesKey, block, false).toString('base64url');
  }

  /** The ID (a BigInt) of token; throws TokenError when it does not decode. */
  decode(token) {
    if (typeof token !== 'string' || !TOKEN.test(token)) throw new TokenError('malformed', 'not a token (23 characters: a key id, then base64url)');
    const keyID = ALPHABET.indexOf(token[0]);
    const key = this.derived.get(keyID);
    if (!key) throw new TokenError('unknown key', `key ${keyID} is not in the key set`);
    const block = aes256(key.aesKey, Buffer.from(token.slice(1), 'base64url'), true);
    if (!timingSafeEqual(block.subarray(8), key.check)) throw new TokenError('not authentic', `not a token of kind ${JSON.stringify(this.kind)} under key ${keyID}`);
    return block.readBigInt64BE(0);
  }
}

/** Checks every vector of the file at path; returns the failures. */
function checkVectors(path) {
  const v = JSON.parse(readFileSync(path, 'utf8'));
  const keys = new Map(v.keys.map((k) => [k.id, Buffer.from(k.secret, 'base64')]));
  const failures = [];
  for (const t of v.tokens) {
    const c = new Codec(keys, t.key, t.kind);
    const id = BigInt(t.id);
    const got = c.encode(id);
    if (got !== t.token) failures.push(`key ${t.key}, ${t.kind}, ID ${t.id}: encode gives ${got}, the vector says ${t.token}`);
    try {
      const back = c.decode(t.token);
      if (back !== id) failures.push(`${JSON.stringify(t.token)} (${t.kind}): decodes to ${back}, the vector says ${t.id}`);
    } catch (e) {
      failures.push(`${JSON.stringify(t.token)} (${t.kind}): ${e.message}`);
    }
  }
  for (const r of v.refused) {
    const c = new Codec(keys, v.keys[0].id, r.kind);
    try {
      const id = c.decode(r.token);
      failures.push(`${JSON.stringify(r.token)} (${r.kind}, ${r.why}): decodes to ${id}, want ${r.error}`);
    } catch (e) {
      if (!(e instanceof TokenError) || e.reason !== r.error) failures.push(`${JSON.stringify(r.token)} (${r.kind}, ${r.why}): ${e.message}, want ${r.error}`);
    }
  }
  return { failures, tokens: v.tokens.length, refused: v.refused.length };
}

function usage(msg) {
  stderr.write(`publicid.mjs: ${msg}\nusage: node publicid.mjs vectors FILE | encode --keys FILE --kind KIND ID... | decode --keys FILE --kind KIND TOKEN...\n`);
  exit(2);
}

function main(args) {
  if (typeof hkdfSync !== 'function') usage(`Node.js ${process.version} has no crypto.hkdfSync: needs 16 or later`);
  const [cmd, ...rest] = args;
  if (cmd === 'vectors') {
    if (rest.length !== 1) usage('vectors takes one file');
    const { failures, tokens, refused } = checkVectors(rest[0]);
    for (const f of failures) stderr.write(`publicid.mjs vectors: ${f}\n`);
    if (failures.length > 0) exit(1);
    stdout.write(`vectors: ${tokens} tokens decoded and encoded, ${refused} refused as expected\n`);
    return;
  }
  if (cmd !== 'encode' && cmd !== 'decode') usage(`unknown command ${JSON.stringify(cmd ?? '')}`);
  let keysFile, kind;
  while (rest.length > 0 && (rest[0] === '--keys' || rest[0] === '--kind')) {
    const [flag, value] = rest.splice(0, 2);
    if (value === undefined) usage(`${flag} needs a value`);
    if (flag === '--keys') keysFile = value;
    else kind = value;
  }
  if (!keysFile || kind === undefined) usage('--keys FILE and --kind KIND are required');
  if (rest.length === 0) usage(`no ${cmd === 'encode' ? 'IDs' : 'tokens'} given`);
  let codec;
  try {
    const { primary, keys } = parseKeyFile(readFileSync(keysFile, 'utf8'));
    codec = new Codec(keys, primary, kind);
  } catch (e) {
    usage(`${keysFile}: ${e.message}`);
  }
  const out = [];
  let failed = false;
  for (const a of rest) {
    if (cmd === 'encode') {
      if (!/^-?[0-9]+$/.test(a) || BigInt(a) < INT64_MIN || BigInt(a) > INT64_MAX) usage(`${JSON.stringify(a)} is not a decimal int64`);
      out.push(codec.encode(BigInt(a)));
      continue;
    }
    try {
      out.push(String(codec.decode(a)));
    } catch (e) {
      if (!(e instanceof TokenError)) throw e;
      stderr.write(`publicid.mjs decode: ${JSON.stringify(a)}: ${e.message}\n`);
      failed = true;
    }
  }
  if (failed) exit(1);
  stdout.write(out.map((s) => s + '\n').join(''));
}

if (import.meta.url === pathToFileURL(argv[1]).href) main(argv.slice(2));
