// Maps the SDK's camelCase to the API's snake_case and back, for object keys at any depth.

/**
 * Properties whose values are maps keyed by the caller or by names (environment variables,
 * metadata, runtimes' versions): their keys pass unchanged both ways. Each is listed in both
 * cases. test/case.test.ts checks this list against every map (additionalProperties) in the
 * OpenAPI document.
 */
export const opaqueProperties: ReadonlySet<string> = new Set(["env", "metadata", "runtime_versions", "runtimeVersions"]);

/** "idleTimeoutS" → "idle_timeout_s". */
export function snakeCase(key: string): string {
  return key.replace(/[A-Z]/g, (c) => "_" + c.toLowerCase());
}

/** "idle_timeout_s" → "idleTimeoutS". */
export function camelCase(key: string): string {
  return key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
}

function mapKeys(value: unknown, rename: (key: string) => string): unknown {
  if (Array.isArray(value)) {
    return value.map((v) => mapKeys(v, rename));
  }
  if (value === null || typeof value !== "object" || !isPlainObject(value)) {
    return value; // Dates, Buffers and primitives are values, not records
  }
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    const name = rename(k);
    out[name] = opaqueProperties.has(name) ? v : mapKeys(v, rename);
  }
  return out;
}

function isPlainObject(v: object): boolean {
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

/** A request body or query in camelCase, as the API wants it: snake_case keys. */
export function toSnake(value: unknown): unknown {
  return mapKeys(value, snakeCase);
}

/** An answer of the API with camelCase keys. */
export function toCamel(value: unknown): unknown {
  return mapKeys(value, camelCase);
}

// Type-level mapping, so that the generated snake_case types read in camelCase.

type CamelKey<S extends string> = S extends `${infer Head}_${infer Tail}`
  ? `${Head}${Capitalize<CamelKey<Tail>>}`
  : S;

type OpaqueKey = "env" | "metadata" | "runtime_versions";

/** T with camelCase keys at every depth (maps keyed by the caller left as they are). */
export type Camelize<T> = T extends readonly (infer U)[]
  ? Camelize<U>[]
  : T extends object
    ? { [K in keyof T as K extends string ? CamelKey<K> : K]: K extends OpaqueKey ? T[K] : Camelize<T[K]> }
    : T;

