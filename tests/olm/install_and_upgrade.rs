//! Install and upgrade through real OLM (`make test-olm`): to be ported from hack/olm/test-olm.sh.
