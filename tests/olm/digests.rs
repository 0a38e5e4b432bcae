//! A release bundle pinned by digest (`make test-digests`): to be ported from hack/olm/test-digests.sh.
