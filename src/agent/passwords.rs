//! memcached's password file (`-Y`) as the agent keeps it: the Secret's credentials, the
//! passwords in force during a rotation's grace, and the file written whole.

use std::io;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::{Paths, reload_memcached};
use crate::resources::auth::{self, PASSWORD_KEY, USERNAME_KEY};

/// memcached keeps at most 8 entries of its password file.
const MAX_ENTRIES: usize = 8;

/// One `user:password` entry of memcached's file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl Credentials {
    /// The Secret's files as mounted; refused if memcached's file could not hold them (the
    /// operator checks this too before it mounts a Secret, but the Secret may change after).
    pub fn read(dir: &Path) -> io::Result<Credentials> {
        let read = |key: &str| -> io::Result<String> {
            let value = std::fs::read_to_string(dir.join(key))?;
            match auth::value_problem(value.as_bytes()) {
                Some(problem) => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{key} {problem}"),
                )),
                None => Ok(value),
            }
        };
        Ok(Credentials {
            username: read(USERNAME_KEY)?,
            password: read(PASSWORD_KEY)?,
        })
    }

    pub(super) fn line(&self) -> String {
        format!("{}:{}\n", self.username, self.password)
    }

    /// The entries of a password file (lines without a colon are skipped, as memcached would
    /// refuse the file).
    fn parse_file(text: &str) -> Vec<Credentials> {
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(u, p)| Credentials {
                username: u.to_string(),
                password: p.to_string(),
            })
            .collect()
    }

    /// memcached's ASCII login: a `set` whose data is `<username> <password>`.
    pub(super) fn login_command(&self) -> String {
        let data = format!("{} {}", self.username, self.password);
        format!("set auth 0 0 {}\r\n{data}\r\n", data.len())
    }
}

/// The passwords memcached accepts: the current one, and earlier ones until their grace ends.
#[derive(Debug)]
pub struct Passwords {
    current: Credentials,
    retiring: Vec<(Credentials, Instant)>,
    grace: Duration,
}

impl Passwords {
    pub fn new(current: Credentials, grace: Duration) -> Self {
        Passwords {
            current,
            retiring: Vec::new(),
            grace,
        }
    }

    /// Keeps `earlier` (e.g. read back from the file after the agent restarted) working for a
    /// grace period from `now`.
    pub fn retire(&mut self, earlier: Vec<Credentials>, now: Instant) {
        for c in earlier {
            if c != self.current && !self.retiring.iter().any(|(r, _)| *r == c) {
                self.retiring.push((c, now + self.grace));
            }
        }
        // The newest first, as many as memcached keeps.
        self.retiring
            .sort_by_key(|(_, until)| std::cmp::Reverse(*until));
        self.retiring.truncate(MAX_ENTRIES - 1);
    }

    /// A new current password; whether the set changed.
    pub fn rotate(&mut self, new: Credentials, now: Instant) -> bool {
        if new == self.current {
            return false;
        }
        let old = std::mem::replace(&mut self.current, new);
        self.retiring.retain(|(c, _)| *c != self.current);
        if !self.grace.is_zero() {
            self.retire(vec![old], now);
        }
        true
    }

    /// Drops passwords whose grace has ended; whether any was.
    pub fn expire(&mut self, now: Instant) -> bool {
        let before = self.retiring.len();
        self.retiring.retain(|(_, until)| *until > now);
        self.retiring.len() != before
    }

    /// The file's text: the current password first.
    pub fn file(&self) -> String {
        self.in_force().map(Credentials::line).collect()
    }

    pub fn current(&self) -> &Credentials {
        &self.current
    }

    /// Every password honoured now: the current one first.
    pub fn in_force(&self) -> impl Iterator<Item = &Credentials> {
        std::iter::once(&self.current).chain(self.retiring.iter().map(|(c, _)| c))
    }
}

/// Writes the file whole (a rename), so memcached never reads half of it; only memcached's user
/// may read it.
pub(super) fn write_file(path: &Path, text: &str) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    io::Write::write_all(&mut file, text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(tmp, path)
}

/// memcached's password file as the agent keeps it: the passwords in force, and the text last
/// written.
pub(super) struct PasswordFile {
    paths: Paths,
    pub(super) passwords: Passwords,
    written: String,
}

impl PasswordFile {
    pub(super) fn open(paths: Paths, grace: Duration) -> io::Result<PasswordFile> {
        let mut passwords = Passwords::new(Credentials::read(&paths.credentials)?, grace);
        // A restarted agent keeps the passwords its predecessor still honoured, for a new grace
        // period.
        let written = std::fs::read_to_string(&paths.auth_file).unwrap_or_default();
        passwords.retire(Credentials::parse_file(&written), Instant::now());
        Ok(PasswordFile {
            paths,
            passwords,
            written,
        })
    }

    /// Reads the Secret and drops expired passwords; rewrites the file and signals memcached if
    /// that changed it. The new current password, if it changed.
    pub(super) fn sync(&mut self, now: Instant) -> io::Result<Option<Credentials>> {
        let mut rotated = None;
        match Credentials::read(&self.paths.credentials) {
            Ok(new) => {
                if self.passwords.rotate(new, now) {
                    info!(grace = ?self.passwords.grace, "the Secret changed: a new password");
                    rotated = Some(self.passwords.current().clone());
                }
            }
            Err(error) => warn!(%error, "cannot read the Secret; keeping the passwords in force"),
        }
        if self.passwords.expire(now) {
            info!("a previous password's grace period ended");
        }
        let text = self.passwords.file();
        if text != self.written {
            write_file(&self.paths.auth_file, &text)?;
            self.written = text;
            let signalled = reload_memcached()?;
            info!(
                signalled,
                entries = self.written.lines().count(),
                "password file rewritten"
            );
        }
        Ok(rotated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(password: &str) -> Credentials {
        Credentials {
            username: "app".into(),
            password: password.into(),
        }
    }

    #[test]
    fn a_rotation_keeps_the_old_password_for_the_grace_period() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(60);
        let mut p = Passwords::new(creds("one"), grace);
        assert_eq!(p.file(), "app:one\n");
        assert!(!p.rotate(creds("one"), t0), "unchanged");
        assert!(p.rotate(creds("two"), t0));
        assert_eq!(p.file(), "app:two\napp:one\n");
        assert!(!p.expire(t0 + grace - Duration::from_secs(1)));
        assert!(p.expire(t0 + grace));
        assert_eq!(p.file(), "app:two\n");
    }

    #[test]
    fn no_grace_drops_the_old_password_at_once() {
        let mut p = Passwords::new(creds("one"), Duration::ZERO);
        assert!(p.rotate(creds("two"), Instant::now()));
        assert_eq!(p.file(), "app:two\n");
    }

    #[test]
    fn rotating_back_does_not_list_a_password_twice() {
        let t0 = Instant::now();
        let mut p = Passwords::new(creds("one"), Duration::from_secs(60));
        p.rotate(creds("two"), t0);
        p.rotate(creds("one"), t0);
        assert_eq!(p.file(), "app:one\napp:two\n");
    }

    #[test]
    fn a_restarted_agent_honours_what_its_file_held_and_memcacheds_limit() {
        let t0 = Instant::now();
        let mut p = Passwords::new(creds("new"), Duration::from_secs(60));
        let file: String = (0..12).map(|i| format!("app:old{i}\n")).collect();
        p.retire(Credentials::parse_file(&format!("app:new\n{file}")), t0);
        assert_eq!(p.file().lines().count(), MAX_ENTRIES);
        assert!(p.file().starts_with("app:new\n"));
    }

    #[test]
    fn the_login_is_memcacheds_ascii_authentication() {
        assert_eq!(creds("pw").login_command(), "set auth 0 0 6\r\napp pw\r\n");
    }

    #[test]
    fn secret_files_memcached_cannot_hold_are_refused() {
        let dir = std::env::temp_dir().join(format!("agent-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("username"), "app").unwrap();
        std::fs::write(dir.join("password"), "pw\n").unwrap();
        assert!(Credentials::read(&dir).is_err(), "a trailing newline");
        std::fs::write(dir.join("password"), "pw").unwrap();
        assert_eq!(Credentials::read(&dir).unwrap(), creds("pw"));
        let file = dir.join("auth");
        write_file(&file, "app:pw\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
