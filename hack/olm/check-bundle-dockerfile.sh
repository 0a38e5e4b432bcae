#!/usr/bin/env bash
# Fails when bundle.Dockerfile's LABELs disagree with bundle/metadata/annotations.yaml.
# OLM reads a bundle image's annotations from metadata/annotations.yaml; registries and opm read
# the image labels; both must carry the same keys and values. Also checks that the Dockerfile
# is FROM scratch and COPYs the manifests and metadata directories the annotations name.
#
# Usage: hack/olm/check-bundle-dockerfile.sh [DOCKERFILE [ANNOTATIONS]]
#        (default: bundle.Dockerfile bundle/metadata/annotations.yaml)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DOCKERFILE="${1:-${REPO_ROOT}/bundle.Dockerfile}"
ANNOTATIONS="${2:-${REPO_ROOT}/bundle/metadata/annotations.yaml}"

annotations_json="$(yq -c '.annotations // error("no annotations: map")' "${ANNOTATIONS}")"

python3 - "${DOCKERFILE}" "${annotations_json}" <<'EOF'
import json, shlex, sys

dockerfile, annotations = sys.argv[1], json.loads(sys.argv[2])
problems = []

# Join continuation lines, drop comments, split into instructions.
instructions, cur = [], ""
for raw in open(dockerfile, encoding="utf-8"):
    line = raw.rstrip("\n")
    if not cur and line.lstrip().startswith("#"):
        continue
    if line.endswith("\\"):
        cur += line[:-1] + " "
        continue
    cur += line
    if cur.strip():
        instructions.append(cur.strip())
    cur = ""

labels, copies, froms = {}, [], []
for ins in instructions:
    word, _, rest = ins.partition(" ")
    word = word.upper()
    if word == "LABEL":
        for tok in shlex.split(rest):
            key, sep, value = tok.partition("=")
            if not sep:
                problems.append(f"LABEL without '=': {tok!r}")
                continue
            if key in labels and labels[key] != value:
                problems.append(f"LABEL {key} set twice ({labels[key]!r}, {value!r})")
            labels[key] = value
    elif word == "COPY":
        copies.append(shlex.split(rest))
    elif word == "FROM":
        froms.append(rest.strip())

if froms != ["scratch"]:
    problems.append(f"expected a single 'FROM scratch', found {froms}")

for key in sorted(set(annotations) | set(labels)):
    a, l = annotations.get(key), labels.get(key)
    if a is None:
        problems.append(f"LABEL {key}={l!r} is not in annotations.yaml")
    elif l is None:
        problems.append(f"annotation {key}={a!r} has no LABEL")
    elif str(a) != l:
        problems.append(f"{key}: annotations.yaml has {a!r}, bundle.Dockerfile has {l!r}")

def copied_to(dest):
    dest = dest.rstrip("/") + "/"
    return any(c and c[-1].rstrip("/") + "/" == dest for c in copies)

for key, default in (("operators.operatorframework.io.bundle.manifests.v1", "manifests/"),
                     ("operators.operatorframework.io.bundle.metadata.v1", "metadata/")):
    dest = "/" + str(annotations.get(key, default)).strip("/") + "/"
    if not copied_to(dest):
        problems.append(f"no COPY to {dest} ({key})")

if problems:
    print("bundle.Dockerfile and annotations.yaml disagree:", file=sys.stderr)
    for p in problems:
        print("  - " + p, file=sys.stderr)
    sys.exit(1)
print(f"bundle.Dockerfile: {len(labels)} LABELs match {len(annotations)} annotations; FROM scratch; COPYs manifests and metadata")
EOF
