#!/usr/bin/env python3
"""What hack/images.sh and hack/check-image.sh read from the operator's Dockerfile, so the image
built here without Docker follows the Dockerfile instead of a copy of it.

  dockerfile.py runtime-stage DOCKERFILE    the last stage (FROM ... to the end), verbatim
  dockerfile.py builder-script DOCKERFILE   the builder stage's `cargo build` RUN as a bash script
                                            for this machine (see builder_script)
  dockerfile.py context ROOT                the files the build context holds (.dockerignore applied)
  dockerfile.py expect DOCKERFILE [ARG=VALUE...]
                                            the runtime stage's USER, ENTRYPOINT, CMD, ENV, LABELs
                                            (ARGs filled in) and COPY destinations, as JSON
  dockerfile.py build DOCKERFILE            what the builder stage builds: toolchain, libc, static
"""
import fnmatch
import json
import os
import re
import shlex
import sys


def instructions(text):
    """(line number, instruction) pairs: continuations joined, comments and blanks dropped."""
    out, cur, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not cur:
            start = n
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        out.append((start, cur.strip()))
        cur = ""
    if cur.strip():
        out.append((start, cur.strip()))
    return out


def stages(text):
    """[(name or None, FROM line number, [instructions after FROM])]."""
    result = []
    for n, ins in instructions(text):
        word, _, rest = ins.partition(" ")
        if word.upper() == "FROM":
            parts = [p for p in rest.split() if not p.startswith("--")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            result.append({"from": parts[0], "name": name, "line": n, "body": []})
        elif result:
            result[-1]["body"].append(ins)
    return result


def runtime_stage(text):
    last = stages(text)[-1]
    return "\n".join(text.splitlines()[last["line"] - 1 :]) + "\n"


def builder_script(text):
    """The builder stage's RUN that calls `cargo build`, for this machine: the stage's ENV
    exported first, no cache mounts (the target directory is the caller's CARGO_TARGET_DIR), and
    the stage's outputs (absolute paths written at /) under "${BUILDER_OUT}". The caller sets
    TARGETARCH, as BuildKit does."""
    builder = next(s for s in stages(text) if s["name"] == "builder")
    runs = [i for i in builder["body"] if i.upper().startswith("RUN ") and "cargo build" in i]
    if len(runs) != 1:
        sys.exit(f"expected one RUN with `cargo build` in the builder stage, found {len(runs)}")
    script = runs[0][4:].strip()
    while script.startswith("--"):
        script = script.split(None, 1)[1]
    # `cp X /memcached-operator`, `>/passwd`: outputs at the builder's root.
    script, n = re.subn(r'(\s|>)/(memcached-operator|passwd|group)\b', r'\1"${BUILDER_OUT}"/\2', script)
    if n != 3:
        sys.exit(f"expected the builder RUN to write /memcached-operator, /passwd and /group; rewrote {n} paths")
    env = [f"export {shlex.quote(k + '=' + v)}" for k, v in stage_env(builder).items()]
    return "\n".join(["set -euo pipefail", *env, script]) + "\n"


def stage_env(stage):
    """The ENV a stage sets, in order."""
    env = {}
    for ins in stage["body"]:
        word, _, rest = ins.partition(" ")
        if word.upper() == "ENV":
            for tok in shlex.split(rest):
                key, _, value = tok.partition("=")
                env[key] = value
    return env


def build(text):
    """What the builder stage says it builds: the Rust toolchain (rust:<version>), the target's
    C library (gnu or musl) and whether the binary is static (crt-static)."""
    builder = next(s for s in stages(text) if s["name"] == "builder")
    image = builder["from"]
    rust = image.split(":", 1)[1] if image.startswith("rust:") else None
    script = builder_script(text)
    libc = sorted(set(re.findall(r"-unknown-linux-(gnu|musl)", script)))
    static = "+crt-static" in script or libc == ["musl"]
    return {"rust": rust, "libc": "/".join(libc) or None, "static": static}


def dockerignore_patterns(root):
    path = os.path.join(root, ".dockerignore")
    pats = []
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            neg = line.startswith("!")
            pat = line[1:] if neg else line
            pats.append((neg, os.path.normpath(pat.strip("/"))))
    return pats


def excluded(rel, pats):
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    out = False
    for neg, pat in pats:
        if any(fnmatch.fnmatchcase(p, pat) and p.count("/") == pat.count("/") for p in prefixes):
            out = not neg
    return out


def context(root):
    pats = dockerignore_patterns(root)
    negated = [p for neg, p in pats if neg]
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        keep = []
        for d in sorted(dirnames):
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            # Skip an excluded directory unless a `!pattern` may admit something below it.
            if excluded(rel, pats) and not any(p == rel or p.startswith(rel + "/") for p in negated):
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            rel = f if rel_dir == "." else f"{rel_dir}/{f}"
            if not excluded(rel, pats):
                files.append(rel)
    return sorted(files)


def expect(text, build_args):
    """The runtime stage's promises, its ARGs filled in from build_args (NAME -> value)."""
    last = stages(text)[-1]
    exp = {"from": last["from"], "user": None, "entrypoint": None, "cmd": None, "env": {}, "labels": {}, "copies": []}
    args = {}

    def fill(value):
        def arg(m):
            name = m.group(1) or m.group(2)
            if args.get(name) is None:
                exp.setdefault("unset", []).append(name)
                return ""
            return args[name]

        return re.sub(r"\$\{(\w+)\}|\$(\w+)", arg, value)

    for ins in last["body"]:
        word, _, rest = ins.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "ARG":
            name, sep, default = rest.partition("=")
            args[name] = build_args.get(name, default if sep else None)
        elif word == "LABEL":
            for tok in shlex.split(rest):
                key, sep, value = tok.partition("=")
                if not sep:
                    sys.exit(f"LABEL without '=': {tok!r}")
                exp["labels"][key] = fill(value)
        elif word == "USER":
            exp["user"] = rest
        elif word in ("ENTRYPOINT", "CMD"):
            if not rest.startswith("["):
                sys.exit(f"{word} in shell form: {rest!r} (the exec form is expected)")
            exp[word.lower()] = json.loads(rest)
        elif word == "ENV":
            for tok in shlex.split(rest):
                key, _, value = tok.partition("=")
                exp["env"][key] = value
        elif word in ("COPY", "ADD"):
            args = [a for a in shlex.split(rest) if not a.startswith("--")]
            opts = [a for a in shlex.split(rest) if a.startswith("--")]
            *srcs, dest = args
            for src in srcs:
                target = dest.rstrip("/") + "/" + os.path.basename(src) if dest.endswith("/") else dest
                exp["copies"].append({"src": src, "dest": target, "opts": opts})
        elif word in ("RUN", "WORKDIR", "VOLUME", "EXPOSE", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "ONBUILD"):
            exp.setdefault("other", []).append(ins)
    return exp


def main():
    if len(sys.argv) < 3 or (len(sys.argv) > 3 and sys.argv[1] != "expect"):
        sys.exit(__doc__)
    cmd, arg = sys.argv[1], sys.argv[2]
    if cmd == "context":
        print("\n".join(context(arg)))
        return
    text = open(arg, encoding="utf-8").read()
    if cmd == "build":
        print(json.dumps(build(text)))
        return
    if cmd == "runtime-stage":
        sys.stdout.write(runtime_stage(text))
    elif cmd == "builder-script":
        sys.stdout.write(builder_script(text))
    elif cmd == "expect":
        build_args = dict(a.split("=", 1) for a in sys.argv[3:])
        print(json.dumps(expect(text, build_args), indent=2))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
