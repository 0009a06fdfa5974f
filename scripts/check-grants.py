#!/usr/bin/env python3
"""Every statement a service runs is allowed to its database role.

The services log in as their own roles (migrations/0029_service_roles.sql),
granted table by table and column by column. A statement its role may not
run fails only when it runs; this check finds it before. It maps each
service to the store statements its code can reach (statically: the store
functions the service's crates call, and the store functions those call,
matched to crates/store/.sqlx by their text), applies migrations/ to a
scratch database, and EXPLAINs every statement as the service's role:
EXPLAIN checks the privileges on every table and column a statement
touches (the bodies of SQL functions and triggers it runs are not
checked; the stack tests run those as the roles).

  scripts/check-grants.py             check (make lint runs it)
  scripts/check-grants.py --list      also print which statements each role runs

Needs psql and the Postgres THREADLINE_TEST_ADMIN_URL names (default the
local one), like scripts/sqlx-prepare.sh.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORE = os.path.join(ROOT, "crates/store/src")
# The crates each service binary links that call the store. Of the shared
# threadline_tenancy only the modules a service names count: the gateway
# seals tokens and registers installations (`installations`) but never
# opens or refreshes one (`tokens`, whose statements read the sealed
# columns); the workers open them and register nothing.
# The relay is the gateway binary with THREADLINE_RELAY_ENABLED=true, on a
# role of its own (migrations/0031_relay_role.sql): the gateway's role runs
# none of the relay's statements (`gateway!relay.rs`: the crate without
# that file), the relay's all of the crate's.
SERVICES = {
    "threadline_gateway": ["gateway!relay.rs", "runtime"],
    "threadline_relay": ["gateway", "runtime"],
    "threadline_context_builder": ["context-builder", "runtime"],
    "threadline_inference": ["inference", "runtime"],
    "threadline_publisher": ["publisher", "runtime"],
}


def norm(s):
    return re.sub(r"\s+", " ", s).strip()


def rust_sources(path):
    """A crate's (or one file's) sources without their unit tests; `crate!file.rs`
    leaves that file of its `src/` out."""
    text = ""
    path, _, left_out = path.partition("!")
    files = [path] if path.endswith(".rs") else glob.glob(os.path.join(path, "src/**/*.rs"), recursive=True)
    if left_out:
        files = [f for f in files if os.path.relpath(f, os.path.join(path, "src")) != left_out]
    for f in sorted(files):
        with open(f) as fh:
            text += fh.read().split("#[cfg(test)]")[0] + "\n"
    return text


def statements():
    out = {}
    for f in glob.glob(os.path.join(ROOT, "crates/store/.sqlx/*.json")):
        with open(f) as fh:
            d = json.load(fh)
        out[norm(d["query"])] = d
    return out


FN = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?(?:async\s+)?fn\s+(\w+)", re.M)
LITERAL = re.compile(r'r#"(.*?)"#|"((?:[^"\\]|\\.)*)"', re.S)
CALL = r"\s*(?:::<[^>]*>)?\("


def store_functions(known):
    """(module, fn) -> the statements in its body and the calls it makes."""
    mods = {os.path.basename(f)[:-3] for f in glob.glob(os.path.join(STORE, "*.rs"))}
    funcs = {}
    for f in sorted(glob.glob(os.path.join(STORE, "*.rs"))):
        mod = os.path.basename(f)[:-3]
        with open(f) as fh:
            src = fh.read().split("#[cfg(test)]")[0]
        ms = list(FN.finditer(src))
        for i, m in enumerate(ms):
            body = src[m.start() : ms[i + 1].start() if i + 1 < len(ms) else len(src)]
            qs = set()
            for lit in LITERAL.finditer(body):
                s = lit.group(1)
                if s is None:
                    s = re.sub(r"\\\n\s*", "", lit.group(2)).replace('\\"', '"')
                if norm(s) in known:
                    qs.add(norm(s))
            calls = {(mod, c) for c in re.findall(r"(?<![:\w])(\w+)" + CALL, body)}
            calls |= {(a, b) for a, b in re.findall(r"\b(\w+)::(\w+)" + CALL, body) if a in mods}
            funcs[(mod, m.group(1))] = (qs, calls)
    return funcs


def reach(funcs, key, seen):
    if key in seen or key not in funcs:
        return set()
    seen.add(key)
    qs, calls = funcs[key]
    out = set(qs)
    for c in calls:
        out |= reach(funcs, c, seen)
    return out


def service_statements(known, funcs):
    out = {}
    for role, crates in SERVICES.items():
        text = "".join(rust_sources(os.path.join(ROOT, "crates", c)) for c in crates)
        for m in sorted(set(re.findall(r"threadline_tenancy::(\w+)", text))):
            f = os.path.join(ROOT, "crates/tenancy/src", m + ".rs")
            if os.path.exists(f):
                text += rust_sources(f)
        globs = set(re.findall(r"threadline_store::(\w+)::\*", text))
        named = {}
        for m, body in re.findall(r"threadline_store::(\w+)::\{([^}]*)\}", text):
            named.setdefault(m, set()).update(re.findall(r"\w+", body))
        for m, f in re.findall(r"threadline_store::(\w+)::(\w+)", text):
            named.setdefault(m, set()).add(f)
        qs = set()
        for m, f in funcs:
            if (
                re.search(rf"\b{m}::{f}" + CALL, text)
                or (f in named.get(m, ()) and re.search(rf"(?<![\w:]){f}" + CALL, text))
                or (m in globs and re.search(rf"(?<![\w:]){f}" + CALL, text))
            ):
                qs |= reach(funcs, (m, f), set())
        out[role] = sorted(qs, key=lambda q: known[q]["hash"])
    return out


def psql(url, *args, **kw):
    return subprocess.run(["psql", "-X", "-q", url, *args], capture_output=True, text=True, **kw)


def main():
    listing = "--list" in sys.argv[1:]
    known = statements()
    funcs = store_functions(known)
    per_role = service_statements(known, funcs)
    admin = os.environ.get(
        "THREADLINE_TEST_ADMIN_URL",
        f"postgres://postgres@127.0.0.1:{os.environ.get('TL_PG_PORT', '5432')}/postgres",
    )
    db = f"threadline_check_grants_{os.getpid()}"
    url = admin.rsplit("/", 1)[0] + "/" + db
    r = psql(admin, "-c", f"CREATE DATABASE {db}")
    if r.returncode:
        sys.exit(f"check-grants: FAIL: cannot create a scratch database on {admin}: {r.stderr.strip()}")
    failures = []
    try:
        for m in sorted(glob.glob(os.path.join(ROOT, "migrations/*.sql"))):
            r = psql(url, "-v", "ON_ERROR_STOP=1", "-f", m)
            if r.returncode:
                sys.exit(f"check-grants: FAIL: applying {m}: {r.stderr.strip()}")
        for role, qs in per_role.items():
            script = [f"SET ROLE {role};"]
            for i, q in enumerate(qs):
                d = known[q]
                # sqlx names array types `TextArray`; Postgres `text[]`.
                types = [
                    re.sub(r"(?i)^(\w+?)array$", r"\1[]", t).lower()
                    for t in d["describe"]["parameters"].get("Left", [])
                ]
                args = ", ".join("NULL" for _ in types)
                script += [
                    f"\\warn @@ {d['hash']}",
                    f"PREPARE s{i}({', '.join(types)}) AS {d['query']};" if types else f"PREPARE s{i} AS {d['query']};",
                    f"EXPLAIN EXECUTE s{i}({args});" if types else f"EXPLAIN EXECUTE s{i};",
                    f"DEALLOCATE s{i};",
                ]
            with tempfile.NamedTemporaryFile("w", suffix=".sql") as fh:
                fh.write("\n".join(script) + "\n")
                fh.flush()
                r = psql(url, "-o", "/dev/null", "-f", fh.name)
            current, errs = None, {}
            for line in r.stderr.splitlines():
                if line.startswith("@@ "):
                    current = line[3:].strip()
                elif "ERROR:" in line and current:
                    errs.setdefault(current, line.split("ERROR:", 1)[1].strip())
            by_hash = {known[q]["hash"]: q for q in qs}
            for h, e in sorted(errs.items()):
                failures.append(f"{role}: {e}\n    {norm(by_hash[h])[:200]}\n    (crates/store/.sqlx/query-{h}.json)")
            if listing:
                print(f"== {role}: {len(qs)} statements")
                for q in qs:
                    print(f"   {known[q]['hash'][:12]} {norm(q)[:110]}")
    finally:
        psql(admin, "-c", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    if failures:
        print("check-grants: FAIL: statements a service runs that its role may not:", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        print(
            "check-grants: grant what the statement needs in a migration (migrations/README.md)",
            file=sys.stderr,
        )
        sys.exit(1)
    counts = ", ".join(f"{r.removeprefix('threadline_')} {len(q)}" for r, q in per_role.items())
    print(f"check-grants: ok   every statement each service reaches is allowed to its role ({counts})")


if __name__ == "__main__":
    main()
