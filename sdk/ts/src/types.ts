// The SDK's types: the OpenAPI document's schemas (src/openapi.ts, generated) in camelCase.
import type { Camelize } from "./case.js";
import type { components } from "./openapi.js";

type Schemas = components["schemas"];

export type Session = Camelize<Schemas["Session"]>;
export type SessionState = Schemas["SessionState"];
export type Snapshot = Camelize<Schemas["Snapshot"]>;
export type Run = Camelize<Schemas["Run"]>;
export type ExecResult = Camelize<Schemas["ExecResult"]>;
export type FileInfo = Camelize<Schemas["FileInfo"]>;
export type Template = Camelize<Schemas["Template"]>;
export type Deleted = Camelize<Schemas["Deleted"]>;

/** One page of a list; pass nextCursor as cursor for the next (null on the last page). */
export interface List<T> {
  object: "list";
  data: T[];
  nextCursor: string | null;
}

/** ?limit= (at most 100) and ?cursor= of a list call. */
export interface Page {
  limit?: number | undefined;
  cursor?: string | undefined;
}

/** A command: a string run by /bin/sh -c, or an argv array. */
export type Command = string | string[];

type OptionalKeys<T> = { [K in keyof T]-?: {} extends Pick<T, K> ? K : never }[keyof T];

/**
 * T whose optional properties also take undefined (left out of the request), so that a value
 * read from a Map or an env var fits under exactOptionalPropertyTypes too.
 */
type Params<T> = { [K in Exclude<keyof T, OptionalKeys<T>>]: T[K] } & { [K in OptionalKeys<T>]?: T[K] | undefined };

export type CreateSessionParams = Params<Camelize<Schemas["CreateSessionRequest"]>>;
export type PatchSessionParams = Params<Camelize<Schemas["PatchSessionRequest"]>>;
export type SnapshotParams = Params<Camelize<Schemas["SnapshotRequest"]>>;
export type ExecParams = Params<Omit<Camelize<Schemas["ExecRequest"]>, "command">> & { command: Command };

export interface ListSessionsParams extends Page {
  state?: SessionState | undefined;
  endUserId?: string | undefined;
}

type RunOptions = Params<Pick<Camelize<Schemas["CreateRunRequest"]>, "endUserId" | "env" | "cwd" | "stdin" | "timeoutS">> & {
  /** false: answer at once, in queued (GET the run later); default: wait for its end. */
  wait?: boolean | undefined;
};

/** A run in an existing session, or an ephemeral one (a fresh tier-1 session used once). */
export type CreateRunParams =
  | (RunOptions & { sessionId: string; command: Command })
  | (RunOptions & { tier: 1; runtime: string; code: string });

/** What a streamed exec yields: output as it comes, then its end. */
export type ExecEvent =
  | { stream: "stdout" | "stderr"; data: Buffer }
  | { exitCode: number; durationMs: number; timedOut: boolean };

/** A terminal's size and command (default: the server's 80×24 running an interactive /bin/sh). */
export interface PtyParams {
  cols?: number | undefined;
  rows?: number | undefined;
  /** Run under /bin/sh -c instead of an interactive shell. */
  command?: string | undefined;
}
