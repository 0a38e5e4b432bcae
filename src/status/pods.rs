//! Why a pod is not Ready, in its own words. Pure: the pod watch decodes the few status fields
//! read here (`PodStatusSeen`) and keeps only the verdict (`PodTrouble`), for pods that are not
//! Ready; a Ready pod costs nothing.

use serde::Deserialize;

/// Why pods are not Ready, as the pods say. Ordered by precedence: when pods disagree, the
/// first cause in this order is the one reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// The image cannot be pulled (a tag that does not exist, a registry out of reach).
    ImagePullFailed,
    /// A container outgrew its memory limit and was killed.
    OomKilled,
    /// A container keeps exiting.
    CrashLooping,
    /// No node takes the pod (a node selector, a toleration, requests nothing fits).
    Unschedulable,
}

impl Cause {
    /// Whether the cause stays until someone changes something (Degraded): a pod that cannot be
    /// scheduled may still be placed when a node joins, the others wait for a fix.
    pub fn lasting(self) -> bool {
        !matches!(self, Self::Unschedulable)
    }
}

/// One pod's reason for not being Ready, with its own message (kept short).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTrouble {
    pub cause: Cause,
    pub words: Box<str>,
}

/// The fields of a pod's status read to find its trouble; serde skips the rest.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatusSeen {
    #[serde(default)]
    pub conditions: Vec<PodConditionSeen>,
    #[serde(default)]
    pub container_statuses: Vec<ContainerStatusSeen>,
    /// Where the autoscaler reads the member's `stats`.
    #[serde(default, rename = "podIP")]
    pub pod_ip: Option<std::net::IpAddr>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodConditionSeen {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default, rename = "lastTransitionTime")]
    pub last_transition_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatusSeen {
    pub name: String,
    #[serde(default)]
    pub ready: bool,
    #[serde(default)]
    pub state: ContainerStateSeen,
    #[serde(default)]
    pub last_state: ContainerStateSeen,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ContainerStateSeen {
    #[serde(default)]
    pub waiting: Option<StateDetail>,
    #[serde(default)]
    pub terminated: Option<StateDetail>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateDetail {
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// Longest pod message kept: a scheduler's message lists every node's reason.
const MAX_WORDS: usize = 240;

impl PodStatusSeen {
    /// Since when the pod is Ready, if it is (now, should it not say when it became so).
    pub fn ready_since(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        let ready = self
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == "True")?;
        Some(
            ready
                .last_transition_time
                .as_ref()
                .map_or_else(k8s_openapi::jiff::Timestamp::now, |t| t.0),
        )
    }

    /// Since when the pod is not Ready, if it is not: its Ready condition's last change, or
    /// (no condition yet) `created`.
    pub fn not_ready_since(
        &self,
        created: Option<k8s_openapi::jiff::Timestamp>,
    ) -> Option<k8s_openapi::jiff::Timestamp> {
        match self.conditions.iter().find(|c| c.type_ == "Ready") {
            Some(c) if c.status == "True" => None,
            Some(c) => c.last_transition_time.as_ref().map(|t| t.0).or(created),
            None => created,
        }
    }

    /// Why this pod is not Ready, if it says; `None` for a Ready pod, or one that is only
    /// starting.
    pub fn trouble(&self) -> Option<PodTrouble> {
        let condition = |type_: &str| self.conditions.iter().find(|c| c.type_ == type_);
        if condition("Ready").is_some_and(|c| c.status == "True") {
            return None;
        }
        if let Some(c) = condition("PodScheduled")
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
        {
            return Some(trouble(
                Cause::Unschedulable,
                c.message.as_deref().unwrap_or("no node takes the pod"),
            ));
        }
        self.container_statuses
            .iter()
            .filter(|c| !c.ready)
            .filter_map(ContainerStatusSeen::trouble)
            .min_by_key(|t| t.cause)
    }
}

impl ContainerStatusSeen {
    fn trouble(&self) -> Option<PodTrouble> {
        let waiting = self.state.waiting.as_ref();
        let waiting_reason = waiting.and_then(|w| w.reason.as_deref());
        if let Some(
            "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull",
        ) = waiting_reason
        {
            let words = waiting
                .and_then(|w| w.message.as_deref())
                .unwrap_or("the image cannot be pulled");
            return Some(trouble(Cause::ImagePullFailed, words));
        }
        // Between restarts the kubelet shows the container terminated (restart count already
        // up), or waiting in CrashLoopBackOff with the last termination (which it sometimes
        // drops), or running again and not yet Ready.
        let crash_looping = waiting_reason == Some("CrashLoopBackOff");
        let ended = self.state.terminated.as_ref();
        let last = ended.or(self.last_state.terminated.as_ref());
        if last.is_some_and(|t| t.reason.as_deref() == Some("OOMKilled")) {
            let words = format!(
                "container {} was killed for exceeding its memory limit",
                self.name
            );
            return Some(trouble(Cause::OomKilled, &words));
        }
        if !crash_looping && ended.is_none() {
            return None;
        }
        let words = match last {
            Some(t) => {
                let code = t.exit_code.unwrap_or_default();
                match t.reason.as_deref() {
                    Some(reason) if reason != "Error" => {
                        format!("container {} exited with code {code} ({reason})", self.name)
                    }
                    _ => format!("container {} exited with code {code}", self.name),
                }
            }
            None => format!("container {} keeps exiting", self.name),
        };
        Some(trouble(Cause::CrashLooping, &words))
    }
}

fn trouble(cause: Cause, words: &str) -> PodTrouble {
    PodTrouble {
        cause,
        words: shorten(words.trim()).into(),
    }
}

/// `text` cut to `MAX_WORDS` bytes at a character boundary, marked with an ellipsis.
fn shorten(text: &str) -> String {
    if text.len() <= MAX_WORDS {
        return text.to_string();
    }
    let mut end = MAX_WORDS;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(json: serde_json::Value) -> PodStatusSeen {
        serde_json::from_value(json).unwrap()
    }

    fn cause_and_words(json: serde_json::Value) -> Option<(Cause, String)> {
        status(json)
            .trouble()
            .map(|t| (t.cause, t.words.into_string()))
    }

    #[test]
    fn a_ready_pod_and_a_starting_one_have_no_trouble() {
        let ready = serde_json::json!({
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "memcached", "ready": true, "state": {"running": {}}}]
        });
        assert_eq!(cause_and_words(ready), None);
        let starting = serde_json::json!({
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [{"name": "memcached", "ready": false,
                                   "state": {"waiting": {"reason": "ContainerCreating"}}}]
        });
        assert_eq!(cause_and_words(starting), None);
        assert_eq!(cause_and_words(serde_json::json!({})), None);
    }

    #[test]
    fn a_pod_no_node_takes_is_unschedulable_in_the_schedulers_words() {
        let pending = serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."}]
        });
        assert_eq!(
            cause_and_words(pending),
            Some((
                Cause::Unschedulable,
                "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
                    .into()
            ))
        );
        assert!(!Cause::Unschedulable.lasting());
    }

    #[test]
    fn an_image_that_cannot_be_pulled_says_why() {
        for reason in ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"] {
            let pulling = serde_json::json!({
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "memcached", "ready": false, "state": {"waiting": {
                    "reason": reason, "message": "failed to pull image \"memcached:nope\": not found"}}}]
            });
            assert_eq!(
                cause_and_words(pulling),
                Some((
                    Cause::ImagePullFailed,
                    "failed to pull image \"memcached:nope\": not found".into()
                )),
                "{reason}"
            );
        }
        assert!(Cause::ImagePullFailed.lasting());
    }

    #[test]
    fn a_container_killed_for_memory_is_oom_killed_until_ready_again() {
        let oom = serde_json::json!({"reason": "OOMKilled", "exitCode": 137});
        for state in [
            serde_json::json!({"state": {"terminated": oom}}),
            serde_json::json!({"state": {"waiting": {"reason": "CrashLoopBackOff",
                "message": "back-off 20s restarting failed container"}}, "lastState": {"terminated": oom}}),
            serde_json::json!({"state": {"running": {}}, "lastState": {"terminated": oom}}),
        ] {
            let mut container = serde_json::json!({"name": "memcached", "ready": false});
            container
                .as_object_mut()
                .unwrap()
                .extend(state.as_object().unwrap().clone());
            let pod = serde_json::json!({"containerStatuses": [container]});
            assert_eq!(
                cause_and_words(pod),
                Some((
                    Cause::OomKilled,
                    "container memcached was killed for exceeding its memory limit".into()
                ))
            );
        }
        let recovered = serde_json::json!({
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "memcached", "ready": true, "state": {"running": {}},
                                   "lastState": {"terminated": oom}}]
        });
        assert_eq!(cause_and_words(recovered), None, "ready again: no trouble");
    }

    #[test]
    fn a_crash_loop_names_the_exit_code_not_the_back_off() {
        let looping = |reason: &str| {
            serde_json::json!({"containerStatuses": [{"name": "memcached", "ready": false,
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                    "message": "back-off 40s restarting failed container=memcached pod=cache-1"}},
                "lastState": {"terminated": {"reason": reason, "exitCode": 64}}}]})
        };
        assert_eq!(
            cause_and_words(looping("Error")),
            Some((
                Cause::CrashLooping,
                "container memcached exited with code 64".into()
            ))
        );
        assert_eq!(
            cause_and_words(looping("ContainerCannotRun")).unwrap().1,
            "container memcached exited with code 64 (ContainerCannotRun)"
        );
    }

    #[test]
    fn a_container_terminated_between_restarts_or_without_its_last_state_is_crash_looping() {
        // As the kubelet shows it between restarts: terminated, restart count already up.
        let terminated = serde_json::json!({"containerStatuses": [{"name": "memcached",
            "ready": false, "restartCount": 3,
            "state": {"terminated": {"reason": "Error", "exitCode": 1}}, "lastState": {}}]});
        assert_eq!(
            cause_and_words(terminated),
            Some((
                Cause::CrashLooping,
                "container memcached exited with code 1".into()
            ))
        );
        // The kubelet sometimes drops the last state while backing off.
        let forgotten = serde_json::json!({"containerStatuses": [{"name": "memcached",
            "ready": false, "restartCount": 5,
            "state": {"waiting": {"reason": "CrashLoopBackOff",
                "message": "back-off 2m40s restarting failed container=memcached pod=mc-1"}},
            "lastState": {}}]});
        assert_eq!(
            cause_and_words(forgotten),
            Some((
                Cause::CrashLooping,
                "container memcached keeps exiting".into()
            ))
        );
    }

    #[test]
    fn of_two_containers_the_graver_cause_is_the_pods() {
        let pod = serde_json::json!({"containerStatuses": [
            {"name": "exporter", "ready": false, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}},
            {"name": "memcached", "ready": false, "state": {"waiting": {"reason": "ImagePullBackOff",
             "message": "Back-off pulling image \"memcached:nope\""}}},
            {"name": "ready", "ready": true, "state": {"waiting": {"reason": "ImagePullBackOff"}}}
        ]});
        assert_eq!(cause_and_words(pod).unwrap().0, Cause::ImagePullFailed);
    }

    #[test]
    fn long_messages_are_cut_at_a_character() {
        let long = "é".repeat(MAX_WORDS);
        let cut = shorten(&long);
        assert!(cut.ends_with('…'));
        assert!(cut.len() <= MAX_WORDS + '…'.len_utf8());
        assert_eq!(shorten("short"), "short");
    }
}
