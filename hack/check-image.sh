#!/usr/bin/env bash
# Fails when the operator image built here (hack/images.sh operator: what the real-node and OLM
# tests run) and the Dockerfile disagree: the image's User, Entrypoint, Cmd, Env and Labels must be
# the runtime stage's USER, ENTRYPOINT, CMD, ENV and LABELs (ARGs filled in; no more, no less;
# buildah's and BuildKit's default PATH aside), and its files exactly the runtime stage's COPY
# destinations (plus their parent directories). The binary must be what the builder stage says it
# builds: its toolchain (FROM rust:X.Y, read from the binary's .comment), its C library (glibc's
# .note.ABI-tag) and static or not. Also: the OCI labels registries and scanners read (source,
# version, revision, created) present, as skopeo reads them, the version the crate's and the
# source the CSV's link; a passwd entry for the USER, a CA bundle; and that config/manager's
# Deployment runs as the image's user.
#
# Then it checks itself: the same image against mutated copies of the Dockerfile (another USER,
# ENTRYPOINT, a LABEL changed or added, a COPY added or dropped, a dynamic or musl build, another
# toolchain, an ARG gone) must each fail.
#
# Usage: hack/check-image.sh [ARCHIVE [DOCKERFILE]]
#        (default: the cached archive of `hack/images.sh operator`, built if missing; ./Dockerfile)
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HACK_DIR}/.." && pwd)"
LOG_TAG=check-image
# shellcheck source=hack/lib.sh
source "${HACK_DIR}/lib.sh"

archive="${1:-}"
dockerfile="${2:-${ROOT}/Dockerfile}"
ensure_packages skopeo
"${HACK_DIR}/images.sh" operator
eval "$("${HACK_DIR}/images.sh" --print-env | grep -E '^OPERATOR_')"
archive="${archive:-${OPERATOR_ARCHIVE}}"
[[ -s "${archive}" ]] || die "no image archive at ${archive}"
# The labels as a registry or a scanner reads them.
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
skopeo inspect "oci-archive:${archive}" >"${tmp}/inspect.json"

# check DOCKERFILE : 0 when the image agrees with it; the disagreements on stderr otherwise.
check() {
	python3 - "$1" "${archive}" "${ROOT}/config/manager/manager.yaml" "${HACK_DIR}/dockerfile.py" \
		"${tmp}/inspect.json" "${ROOT}/config/manifests/bases/memcached-operator.clusterserviceversion.yaml" \
		VERSION="${OPERATOR_VERSION}" REVISION="${OPERATOR_REVISION}" CREATED="${OPERATOR_CREATED}" <<'PY'
import datetime, importlib.util, io, json, re, sys, tarfile

dockerfile, archive, manager, helper, inspected, csv = sys.argv[1:7]
build_args = dict(a.split("=", 1) for a in sys.argv[7:])
spec = importlib.util.spec_from_file_location("dockerfile", helper)
df = importlib.util.module_from_spec(spec)
spec.loader.exec_module(df)
text = open(dockerfile, encoding="utf-8").read()
exp = df.expect(text, build_args)
build = df.build(text)
problems = []
for name in exp.get("unset", []):
    problems.append(f"${{{name}}} in a LABEL is not an ARG with a value")

outer = tarfile.open(archive)
def blob(digest):
    algo, hexd = digest.split(":")
    return outer.extractfile(f"blobs/{algo}/{hexd}").read()
index = json.loads(outer.extractfile("index.json").read())
if len(index["manifests"]) != 1:
    problems.append(f"{len(index['manifests'])} manifests in the archive, expected 1")
manifest = json.loads(blob(index["manifests"][0]["digest"]))
config = json.loads(blob(manifest["config"]["digest"]))
cfg = config.get("config") or {}

if exp["from"] != "scratch":
    problems.append(f"the runtime stage is FROM {exp['from']}, expected scratch")
if exp.get("other"):
    problems.append(f"instructions this check does not compare: {exp['other']}")
if config.get("os") != "linux" or config.get("architecture") != "amd64":
    problems.append(f"platform {config.get('os')}/{config.get('architecture')}")
if cfg.get("User") != exp["user"]:
    problems.append(f"User: image {cfg.get('User')!r}, Dockerfile USER {exp['user']!r}")
if cfg.get("Entrypoint") != exp["entrypoint"]:
    problems.append(f"Entrypoint: image {cfg.get('Entrypoint')}, Dockerfile ENTRYPOINT {exp['entrypoint']}")
if (cfg.get("Cmd") or None) != exp["cmd"]:
    problems.append(f"Cmd: image {cfg.get('Cmd')}, Dockerfile CMD {exp['cmd']}")
env = dict(e.split("=", 1) for e in cfg.get("Env") or [])
default_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
if env.get("PATH") == default_path and "PATH" not in exp["env"]:
    del env["PATH"]  # what buildah and BuildKit give every image
if env != exp["env"]:
    problems.append(f"Env: image {env}, Dockerfile ENV {exp['env']}")
labels = cfg.get("Labels") or {}
for key in sorted(set(labels) | set(exp["labels"])):
    if labels.get(key) != exp["labels"].get(key):
        problems.append(f"label {key}: image {labels.get(key)!r}, Dockerfile {exp['labels'].get(key)!r}")
# What registries and scanners read (OCI image spec annotations, as labels).
oci = "org.opencontainers.image."
for key in ("title", "description", "licenses", "source", "version", "revision", "created"):
    if not labels.get(oci + key):
        problems.append(f"label {oci}{key}: missing or empty")
if labels.get(oci + "version") != build_args.get("VERSION"):
    problems.append(f"label {oci}version {labels.get(oci + 'version')!r}, the crate's version {build_args.get('VERSION')!r}")
try:
    datetime.datetime.fromisoformat(labels.get(oci + "created", "").replace("Z", "+00:00"))
except ValueError:
    problems.append(f"label {oci}created {labels.get(oci + 'created')!r}: not an RFC 3339 time")
links = re.findall(r"- name: Source Code\n\s+url: (\S+)", open(csv, encoding="utf-8").read())
if links and labels.get(oci + "source") != links[0]:
    problems.append(f"label {oci}source {labels.get(oci + 'source')!r}, the CSV's Source Code link {links[0]!r}")
skopeo = json.load(open(inspected))
if (skopeo.get("Labels") or {}) != labels:
    problems.append(f"skopeo inspect reads other labels: {skopeo.get('Labels')}")

# The layers, applied in order (whiteouts remove).
files = {}
for layer in manifest["layers"]:
    with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"]))) as t:
        for m in t.getmembers():
            name = "/" + m.name.lstrip("./").rstrip("/")
            base = name.rsplit("/", 1)[-1]
            if base.startswith(".wh."):
                files.pop(name.rsplit("/", 1)[0] + "/" + base[4:], None)
                continue
            files[name] = (m, t.extractfile(m).read() if m.isfile() else None)
regular = {n for n, (m, _) in files.items() if not m.isdir()}
dirs = {n for n, (m, _) in files.items() if m.isdir()}
want = {c["dest"] for c in exp["copies"]}
parents = {"/".join(d.split("/")[:i]) for d in want for i in range(2, d.count("/") + 1)}
for n in sorted(want - regular):
    problems.append(f"{n}: COPY in the Dockerfile, not in the image")
for n in sorted(regular - want):
    problems.append(f"{n}: in the image, no COPY in the Dockerfile puts it there")
for n in sorted(dirs - parents - {"/"}):
    problems.append(f"directory {n}: in the image, not a parent of a COPY destination")
for n in sorted(regular & want):
    m, _ = files[n]
    if (m.uid, m.gid) != (0, 0):
        problems.append(f"{n}: owned by {m.uid}:{m.gid}, COPY makes it 0:0")

user = (exp["user"] or "").split(":")[0]
if not user.isdigit() or user == "0":
    problems.append(f"USER {exp['user']!r}: not a numeric non-root uid (runAsNonRoot needs one)")
entry = (exp["entrypoint"] or [""])[0]
if entry in files:
    m, data = files[entry]
    if not m.mode & 0o111:
        problems.append(f"{entry}: not executable ({oct(m.mode)})")
    if data[:4] != b"\x7fELF" or data[18] != 62:
        problems.append(f"{entry}: not an x86-64 ELF")
    else:
        u = lambda at, n: int.from_bytes(data[at : at + n], "little")
        # Static: no PT_INTERP (3) among the program headers.
        phoff, phentsize, phnum = u(32, 8), u(54, 2), u(56, 2)
        static = 3 not in [u(phoff + i * phentsize, 4) for i in range(phnum)]
        if not static:
            problems.append(f"{entry}: dynamically linked (PT_INTERP); FROM scratch has no loader")
        # The sections by name: .comment names the compiler, .note.ABI-tag is glibc's.
        shoff, shentsize, shnum, shstrndx = u(40, 8), u(58, 2), u(60, 2), u(62, 2)
        header = lambda i: (u(shoff + i * shentsize, 4), u(shoff + i * shentsize + 24, 8), u(shoff + i * shentsize + 32, 8))
        names_at = header(shstrndx)[1]
        sections = {}
        for i in range(shnum):
            name, off, size = header(i)
            start = names_at + name
            sections[data[start : data.index(b"\0", start)].decode()] = data[off : off + size]
        rustc = re.search(rb"rustc version (\d+\.\d+)\.\d+", sections.get(".comment", b""))
        libc = "gnu" if ".note.ABI-tag" in sections else "musl"
        # The builder stage's promises against the binary it is said to have built.
        if build["static"] != static:
            problems.append(f"{entry}: {'static' if static else 'dynamic'}, the builder stage says {'static' if build['static'] else 'dynamic'}")
        if build["libc"] != libc:
            problems.append(f"{entry}: {libc} libc, the builder stage builds for {build['libc']}")
        if not rustc or rustc.group(1).decode() != build["rust"]:
            problems.append(f"{entry}: built by rustc {rustc and rustc.group(1).decode()}, the builder stage is FROM rust:{build['rust']}")
else:
    problems.append(f"ENTRYPOINT {entry!r} is not a file in the image")
passwd = (files.get("/etc/passwd") or (None, b""))[1] or b""
if user and not any(l.split(":")[2:3] == [user] for l in passwd.decode().splitlines()):
    problems.append(f"/etc/passwd has no entry for uid {user}")
group = (files.get("/etc/group") or (None, b""))[1] or b""
gid = (exp["user"] or ":").split(":")[-1]
if gid and not any(l.split(":")[2:3] == [gid] for l in group.decode().splitlines()):
    problems.append(f"/etc/group has no entry for gid {gid}")
certs = (files.get("/etc/ssl/certs/ca-certificates.crt") or (None, b""))[1] or b""
if certs.count(b"BEGIN CERTIFICATE") < 10:
    problems.append("/etc/ssl/certs/ca-certificates.crt: not a CA bundle")

# The shipped Deployment runs the image as its USER.
text = open(manager, encoding="utf-8").read()
run_as = [l.split(":", 1)[1].strip() for l in text.splitlines() if l.strip().startswith("runAsUser:")]
if run_as and any(r != user for r in run_as):
    problems.append(f"config/manager runAsUser {run_as}, the image's USER {user}")

for p in problems:
    print(f"  {p}", file=sys.stderr)
size = sum(len(d or b"") for _, d in files.values())
print(f"{len(regular)} files, {size / 2**20:.1f} MiB unpacked; User {cfg.get('User')}, Entrypoint {cfg.get('Entrypoint')}; built {build}")
for key, value in sorted(labels.items()):
    print(f"  {key}={value}")
sys.exit(1 if problems else 0)
PY
}

log "checking ${archive} against ${dockerfile}"
if ! check "${dockerfile}"; then
	die "the image and ${dockerfile} disagree (above)"
fi
log "the image agrees with ${dockerfile}"

# The check must notice each kind of disagreement.
mutations=(
	's/^USER .*/USER 0:0/'
	's|^ENTRYPOINT .*|ENTRYPOINT ["/bin/memcached-operator"]|'
	's/org.opencontainers.image.licenses="Apache-2.0"/org.opencontainers.image.licenses="MIT"/'
	's/^USER /LABEL org.opencontainers.image.vendor="someone"\nUSER /'
	's|^USER |COPY --from=builder /memcached-operator /bin/memcached-operator\nUSER |'
	'/^COPY --from=builder \/group /d'
	's|^ENTRYPOINT .*|&\nCMD ["--leader-elect"]|'
	's/+crt-static/-crt-static/'
	's/-unknown-linux-gnu/-unknown-linux-musl/g'
	's/ rust:[0-9.]* AS builder/ rust:1.94 AS builder/'
	'/^ARG CREATED/d'
	's|image.source="[^"]*"|image.source="https://example.org/fork"|'
)
failed=0
for m in "${mutations[@]}"; do
	sed -e "${m}" "${dockerfile}" >"${tmp}/Dockerfile"
	if cmp -s "${dockerfile}" "${tmp}/Dockerfile"; then
		log "self-test: mutation '${m}' changed nothing in the Dockerfile"
		failed=1
	elif check "${tmp}/Dockerfile" >/dev/null 2>"${tmp}/err"; then
		log "self-test: the check passed a Dockerfile mutated by '${m}'"
		failed=1
	else
		log "self-test: '${m}' is caught: $(head -n1 "${tmp}/err" | sed 's/^ *//')"
	fi
done
[[ ${failed} -eq 0 ]] || die "self-test failed"
log "ok"
