// The shared executable spec of the SDKs (clients/spec, its README.md says
// what each file pins): every JSON file of the folder is read, and every
// vector runs as a test of its own, named after it, against this SDK's real
// code. A file whose `spec` this runner does not know, a version other than
// the one it was written for, or a field it does not read fails: the spec
// moved, the runner did not.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { runDecide } from "./spec-decide.js";
import { runDefaults } from "./spec-defaults.js";
import { runErrors } from "./spec-errors.js";
import { specDir, specFiles, type Fields } from "./spec-read.js";
import { runSpool } from "./spec-spool.js";
import { runStream } from "./spec-stream.js";

interface Runner {
  version: number;
  run: (vector: Fields) => Promise<void>;
  // One vector per file (a transcript), not a list of `vectors`.
  whole?: boolean;
  timeoutMs?: number;
}

const runners: Record<string, Runner> = {
  decide: { version: 1, run: runDecide },
  errors: { version: 1, run: runErrors },
  spool: { version: 1, run: runSpool },
  defaults: { version: 1, run: runDefaults },
  stream: { version: 1, run: runStream, whole: true, timeoutMs: 60_000 },
};

const files = specFiles();

describe(`the shared spec (${files.length} files)`, () => {
  it("has files to run", () => {
    assert.ok(files.length > 0, `no spec files under ${specDir}`);
  });
  for (const { rel, doc } of files) {
    const kind = doc.str("spec") ?? "";
    const version = doc.int("version");
    const runner = runners[kind];
    const vectors = runner?.whole === true ? [doc] : (doc.list("vectors") ?? []);
    describe(rel, () => {
      it("is a spec this runner follows", () => {
        assert.ok(runner !== undefined, `${rel}: spec ${JSON.stringify(kind)} has no runner in this SDK`);
        assert.equal(version, runner.version, `${rel}: version ${version}; this runner follows version ${runner.version}`);
        if (runner.whole !== true) {
          doc.done();
        }
        assert.ok(vectors.length > 0, `${rel}: no vectors`);
      });
      if (runner === undefined || version !== runner.version) {
        return;
      }
      const names = new Set<string>();
      for (const v of vectors) {
        const name = v.str("name") ?? "";
        it(name, { timeout: runner.timeoutMs ?? 10_000 }, async () => {
          assert.ok(name !== "" && !names.has(name), `${rel}: a vector needs a name of its own, got ${JSON.stringify(name)}`);
          names.add(name);
          await runner.run(v);
        });
      }
    });
  }
});
