//! Debian's Prometheus (2.42) as a process on 127.0.0.1, with the configuration a test writes,
//! and instant queries through its HTTP API. Killed when dropped.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use memcached_operator_testkit::net::{free_port, http_get};
use serde_json::Value;

pub struct Prometheus {
    child: std::process::Child,
    port: u16,
}

impl Prometheus {
    /// Starts Prometheus in `dir` (its configuration, data and log) with `config` as
    /// prometheus.yml.
    pub fn start(dir: &Path, config: &str) -> Prometheus {
        std::fs::create_dir_all(dir).unwrap();
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus runs (Debian's package: apt-get install prometheus)");
        Prometheus { child, port }
    }

    /// The result vector of an instant query: each sample's labels and value.
    pub async fn query(&self, promql: &str) -> Option<Vec<(BTreeMap<String, String>, f64)>> {
        let encoded: String = promql
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body) = http_get(self.port, &format!("/api/v1/query?query={encoded}")).await?;
        if status != 200 {
            return None;
        }
        let answer: Value = serde_json::from_str(&body).ok()?;
        let samples = answer["data"]["result"].as_array()?;
        samples
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect();
                Some((labels, s["value"][1].as_str()?.parse().ok()?))
            })
            .collect()
    }

    /// The value of a query that gives exactly one sample.
    pub async fn value(&self, promql: &str) -> Option<f64> {
        match &self.query(promql).await?[..] {
            [(_, v)] => Some(*v),
            _ => None,
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
