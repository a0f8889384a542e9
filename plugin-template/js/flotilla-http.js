// Blocking HTTP over the raw wasi:http imports, keeping wasi:http's error codes.
//
// `fetch` would be shorter, but it turns every transport failure into a bare
// "TypeError: NetworkError", so a plugin cannot tell the host's `HTTP-request-denied` (the
// URL is not in the pool's allow-list, or the credential is not bound to that host) from a
// refused connection. Here a failure throws `HttpError`, whose `code` is the wasi:http
// `error-code` variant as `{tag, val}`.
//
// Limits: one request at a time (the exports are synchronous anyway), bodies are buffered,
// and a response body larger than `MAX_RESPONSE_BYTES` is an error. Deadlines are the
// host's: every export call has one.

import { handle } from 'wasi:http/outgoing-handler@0.2.12';
import {
  Fields,
  OutgoingBody,
  OutgoingRequest,
  IncomingBody,
  httpErrorCode,
} from 'wasi:http/types@0.2.12';

/** The largest response body read; more is an error, not a truncation. */
export const MAX_RESPONSE_BYTES = 4 * 1024 * 1024;
/** wasi:io's blocking-write-and-flush takes at most 4096 bytes per call. */
const WRITE_CHUNK = 4096;

/** A request that failed before an HTTP status arrived. `code` is wasi:http's error-code. */
export class HttpError extends Error {
  constructor(code, context) {
    super(`${context}: ${describe(code)}`);
    this.name = 'HttpError';
    this.code = code;
  }
}

/** `HTTP-request-denied`, or `DNS-error {"rcode":"..."}`: the tag and any payload. */
export function describe(code) {
  if (code === undefined || code === null || typeof code.tag !== 'string') {
    return String(code);
  }
  if (code.val === undefined) return code.tag;
  return `${code.tag} ${JSON.stringify(code.val, (_, v) => (typeof v === 'bigint' ? v.toString() : v))}`;
}

/**
 * Sends one request and waits for the whole answer.
 *
 * @param {{method: string, url: string, headers?: Record<string, string>, body?: string}} req
 * @returns {{status: number, header: (name: string) => string | undefined, text: string}}
 * @throws {HttpError} when no HTTP status arrived (denied, refused, reset, timed out...)
 */
export function request({ method, url, headers = {}, body }) {
  const target = new URL(url);
  const encoder = new TextEncoder();
  const fields = Fields.fromList(
    Object.entries(headers).map(([name, value]) => [name.toLowerCase(), encoder.encode(value)]),
  );
  const outgoing = new OutgoingRequest(fields); // takes ownership of `fields`
  outgoing.setMethod(httpMethod(method));
  outgoing.setScheme(target.protocol === 'https:' ? { tag: 'HTTPS' } : { tag: 'HTTP' });
  outgoing.setAuthority(target.host);
  outgoing.setPathWithQuery(target.pathname + target.search);
  const outgoingBody = outgoing.body();

  let future;
  try {
    future = handle(outgoing, undefined); // takes ownership of `outgoing`
  } catch (e) {
    outgoingBody[Symbol.dispose]();
    throw new HttpError(e.payload, `${method} ${url}`);
  }
  try {
    writeBody(outgoingBody, body === undefined ? new Uint8Array() : encoder.encode(body), url);
    return readResponse(future, `${method} ${url}`);
  } finally {
    future[Symbol.dispose]();
  }
}

function httpMethod(method) {
  const known = ['get', 'head', 'post', 'put', 'delete', 'connect', 'options', 'trace', 'patch'];
  const lower = method.toLowerCase();
  return known.includes(lower) ? { tag: lower } : { tag: 'other', val: method };
}

function writeBody(outgoingBody, bytes, context) {
  const stream = outgoingBody.write();
  try {
    for (let at = 0; at < bytes.length; at += WRITE_CHUNK) {
      stream.blockingWriteAndFlush(bytes.subarray(at, at + WRITE_CHUNK));
    }
  } catch (e) {
    throw new HttpError(streamErrorCode(e), `${context}: sending the body`);
  } finally {
    stream[Symbol.dispose](); // a child: dropped before its parent is finished
  }
  try {
    OutgoingBody.finish(outgoingBody, undefined);
  } catch (e) {
    throw new HttpError(e.payload, `${context}: finishing the body`);
  }
}

function readResponse(future, context) {
  let answer = future.get();
  if (answer === undefined) {
    const ready = future.subscribe();
    ready.block();
    ready[Symbol.dispose]();
    answer = future.get();
  }
  // option<result<result<incoming-response, error-code>>>: nested results are {tag, val}.
  if (answer === undefined || answer.tag !== 'ok') {
    throw new HttpError({ tag: 'internal-error', val: 'response lost' }, context);
  }
  if (answer.val.tag !== 'ok') throw new HttpError(answer.val.val, context);
  const response = answer.val.val;
  try {
    const headers = response.headers();
    const decoder = new TextDecoder();
    const header = (name) => {
      const values = headers.get(name.toLowerCase());
      return values.length === 0 ? undefined : decoder.decode(values[0]);
    };
    const retryAfter = header('retry-after');
    const contentType = header('content-type');
    headers[Symbol.dispose]();
    const text = decoder.decode(readBody(response, context));
    const kept = { 'retry-after': retryAfter, 'content-type': contentType };
    return { status: response.status(), header: (name) => kept[name.toLowerCase()], text };
  } finally {
    response[Symbol.dispose]();
  }
}

function readBody(response, context) {
  const body = response.consume();
  const chunks = [];
  let size = 0;
  try {
    const stream = body.stream();
    try {
      for (;;) {
        let chunk;
        try {
          chunk = stream.blockingRead(65536n);
        } catch (e) {
          if (e.payload?.tag === 'closed') break;
          throw new HttpError(streamErrorCode(e), `${context}: reading the body`);
        }
        size += chunk.length;
        if (size > MAX_RESPONSE_BYTES) {
          throw new HttpError({ tag: 'HTTP-response-body-size', val: BigInt(size) }, context);
        }
        chunks.push(chunk);
      }
    } finally {
      stream[Symbol.dispose](); // a child: dropped before its parent body
    }
  } catch (e) {
    body[Symbol.dispose]();
    throw e;
  }
  IncomingBody.finish(body)[Symbol.dispose]();
  const all = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    all.set(chunk, at);
    at += chunk.length;
  }
  return all;
}

/** The wasi:http error-code behind a failed stream operation. */
function streamErrorCode(e) {
  const streamError = e?.payload;
  if (streamError?.tag === 'last-operation-failed') {
    const code = httpErrorCode(streamError.val);
    streamError.val[Symbol.dispose]();
    return code ?? { tag: 'internal-error', val: 'stream failed' };
  }
  if (streamError?.tag === 'closed') return { tag: 'connection-terminated' };
  return { tag: 'internal-error', val: String(e) };
}
