//! Sweeping the members before the proxy's layout changes: each keeps only the keys the layout
//! in force routes to it. A key the jump hash moved to another member leaves a copy behind;
//! the next change could route the key back to it (a scale-in after a scale-out), and that old
//! value would read back as a hit. So before a change, every other key on a member goes: to the
//! member that owns it if the previous layout still serves (reads that miss there would have
//! found it here; added only if the owner has none, so never over a newer value), deleted
//! otherwise. A member outside the layout (draining, or rejoining) is emptied so.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::resources::proxy::owner;

/// A member that takes longer to answer one request (or a batch) is left unswept (a Warning).
const TIMEOUT: Duration = Duration::from_secs(5);
/// Keys handled per round trip, and the bytes of their items held at once (an item may be a
/// MiB or more; the operator's memory is bounded).
const BATCH: usize = 256;
const BATCH_BYTES: usize = 4 << 20;

/// What a sweep did to one member.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Keys the member kept: the layout routes them to it.
    pub kept: u64,
    /// Keys handed to the member that owns them (it had none).
    pub moved: u64,
    /// Keys deleted: their owner had a value of its own, or nothing serves them any more.
    pub deleted: u64,
}

/// Sweeps the member at `source`: `place` is its place in the layout `owners` (None: not in
/// it); with `keep_moved`, a key owned elsewhere is first added to its owner, where that has an
/// address (a member down is not waited for: its keys are deleted here).
pub async fn sweep(
    source: SocketAddr,
    place: Option<usize>,
    owners: &[Option<SocketAddr>],
    keep_moved: bool,
) -> io::Result<Swept> {
    let mut dump = Conn::connect(source).await?;
    let mut work = Conn::connect(source).await?;
    let mut to: HashMap<usize, Conn> = HashMap::new();
    let mut swept = Swept::default();
    dump.send(b"lru_crawler metadump all\r\n").await?;
    let (mut batch, mut bytes): (Vec<(String, usize)>, usize) = (Vec::new(), 0);
    loop {
        let line = dump.line().await?;
        match line.as_str() {
            "END" => break,
            // Some builds (Debian's 1.6.45) say OK before the first key, as the protocol's
            // documentation has it.
            "OK" => continue,
            _ => {}
        }
        let (key, size) = dumped(&line).ok_or_else(|| answered(&line))?;
        // Keys a text client cannot name (set over the binary protocol) are left alone.
        let Some(key) = key else { continue };
        let home = owner(key.as_bytes(), owners.len());
        if Some(home) == place {
            swept.kept += 1;
            continue;
        }
        batch.push((key, home));
        bytes += size;
        if batch.len() == BATCH || bytes >= BATCH_BYTES {
            let batch = std::mem::take(&mut batch);
            bytes = 0;
            hand(&mut work, &mut to, owners, batch, keep_moved, &mut swept).await?;
        }
    }
    hand(&mut work, &mut to, owners, batch, keep_moved, &mut swept).await?;
    Ok(swept)
}

/// Hands `keys` (each with the place of its owner) on, or deletes them.
async fn hand(
    source: &mut Conn,
    to: &mut HashMap<usize, Conn>,
    owners: &[Option<SocketAddr>],
    keys: Vec<(String, usize)>,
    keep_moved: bool,
    swept: &mut Swept,
) -> io::Result<()> {
    let (keys, dropped): (Vec<_>, Vec<_>) = keys
        .into_iter()
        .partition(|(_, home)| keep_moved && owners.get(*home).is_some_and(Option::is_some));
    if !dropped.is_empty() {
        let mut request = Vec::new();
        for (key, _) in &dropped {
            request.extend_from_slice(format!("md {key} q\r\n").as_bytes());
        }
        request.extend_from_slice(b"mn\r\n");
        source.send(&request).await?;
        match source.line().await?.as_str() {
            "MN" => swept.deleted += dropped.len() as u64,
            other => return Err(answered(other)),
        }
    }
    if keys.is_empty() {
        return Ok(());
    }
    // The values, with their flags, time to live and CAS, as they are now.
    let mut request = Vec::new();
    for (key, _) in &keys {
        request.extend_from_slice(format!("mg {key} v f t c\r\n").as_bytes());
    }
    source.send(&request).await?;
    let mut found = Vec::new();
    for (key, home) in keys {
        if let Some(item) = source.item().await? {
            found.push((key, home, item));
        }
    }
    // Added to each owner (mode E: only where it has none), then deleted here unless changed
    // meanwhile; each step one round trip per member. A client's delete between the two
    // reached both copies: the one added is taken back.
    let mut by_owner: HashMap<usize, Vec<(String, Item)>> = HashMap::new();
    for (key, home, item) in found {
        by_owner.entry(home).or_default().push((key, item));
    }
    let mut handed = Vec::new();
    for (home, items) in by_owner {
        let owner = match to.entry(home) {
            std::collections::hash_map::Entry::Occupied(c) => c.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let addr = owners[home].expect("keys of owners with an address only");
                v.insert(Conn::connect(addr).await?)
            }
        };
        let mut request = Vec::new();
        for (key, item) in &items {
            // 0: expiring within the second, so given one (T0 would never expire).
            let ttl = if item.ttl == -1 { 0 } else { item.ttl.max(1) };
            request.extend_from_slice(
                format!(
                    "ms {key} {} F{} T{ttl} ME c\r\n",
                    item.value.len(),
                    item.flags
                )
                .as_bytes(),
            );
            request.extend_from_slice(&item.value);
            request.extend_from_slice(b"\r\n");
        }
        owner.send(&request).await?;
        for (key, item) in items {
            let reply = owner.line().await?;
            let added: Option<u64> = match reply.split(' ').next() {
                Some("HD") => reply
                    .split(' ')
                    .find_map(|t| t.strip_prefix('c')?.parse().ok()),
                Some("NS") => None,
                _ => return Err(answered(&reply)),
            };
            handed.push((key, home, item.cas, added));
        }
    }
    let mut request = Vec::new();
    for (key, _, cas, _) in &handed {
        request.extend_from_slice(format!("md {key} C{cas}\r\n").as_bytes());
    }
    source.send(&request).await?;
    let mut taken_back = Vec::new();
    for (key, home, _, added) in handed {
        let gone = !deleted(&source.line().await?)?;
        match (added, gone) {
            (Some(cas), true) => taken_back.push((key, home, cas)),
            (Some(_), false) => swept.moved += 1,
            (None, _) => swept.deleted += 1,
        }
    }
    for (key, home, cas) in taken_back {
        let owner = to.get_mut(&home).expect("connected above");
        owner.delete(&key, cas).await?;
        swept.deleted += 1;
    }
    Ok(())
}

/// A value as `mg <key> v f t c` gives it.
struct Item {
    value: Vec<u8>,
    flags: u32,
    ttl: i64,
    cas: u64,
}

/// The key and the item's size in a line of `lru_crawler metadump`: `key=<URI-encoded> exp=...
/// size=<bytes> ...`; the key None where a text command cannot carry it; None for a line that
/// is not one.
fn dumped(line: &str) -> Option<(Option<String>, usize)> {
    let encoded = line.strip_prefix("key=")?.split(' ').next()?;
    let size = line
        .split(' ')
        .find_map(|t| t.strip_prefix("size=")?.parse().ok())
        .unwrap_or(0);
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut rest = encoded.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        match b {
            b'%' if tail.len() >= 2 => {
                let hex = std::str::from_utf8(&tail[..2]).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &tail[2..];
            }
            _ => {
                bytes.push(b);
                rest = tail;
            }
        }
    }
    let plain = bytes.len() <= 250 && bytes.iter().all(|b| b.is_ascii_graphic());
    Some((plain.then(|| String::from_utf8(bytes).ok()).flatten(), size))
}

/// One connection to a member, each request answered within `TIMEOUT`.
struct Conn(BufReader<TcpStream>);

impl Conn {
    async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = in_time(TcpStream::connect(addr)).await??;
        Ok(Self(BufReader::new(stream)))
    }

    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        in_time(self.0.get_mut().write_all(bytes)).await?
    }

    async fn line(&mut self) -> io::Result<String> {
        let mut line = String::new();
        match in_time(self.0.read_line(&mut line)).await?? {
            0 => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed")),
            _ => Ok(line.trim_end().to_string()),
        }
    }

    /// The answer to one `mg <key> v f t c`: None for a miss.
    async fn item(&mut self) -> io::Result<Option<Item>> {
        let header = self.line().await?;
        let mut tokens = header.split(' ');
        match tokens.next() {
            Some("EN") => return Ok(None),
            Some("VA") => {}
            _ => return Err(answered(&header)),
        }
        let bad = || answered(&header);
        let len: usize = tokens.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
        let (mut flags, mut ttl, mut cas) = (None, None, None);
        for token in tokens {
            let (flag, value) = token.split_at(1);
            match flag {
                "f" => flags = value.parse().ok(),
                "t" => ttl = value.parse().ok(),
                "c" => cas = value.parse().ok(),
                _ => {}
            }
        }
        let mut value = vec![0; len + 2];
        in_time(self.0.read_exact(&mut value)).await??;
        value.truncate(len);
        Ok(Some(Item {
            value,
            flags: flags.ok_or_else(bad)?,
            ttl: ttl.ok_or_else(bad)?,
            cas: cas.ok_or_else(bad)?,
        }))
    }

    /// Deletes `key` if its CAS is still `cas`; false if it was gone already.
    async fn delete(&mut self, key: &str, cas: u64) -> io::Result<bool> {
        self.send(format!("md {key} C{cas}\r\n").as_bytes()).await?;
        deleted(&self.line().await?)
    }
}

/// The answer to `md <key> C<cas>`: false if the key was gone. EX (its CAS changed) counts as
/// there: here only a touch changes it (the previous layout's reads).
fn deleted(reply: &str) -> io::Result<bool> {
    match reply {
        "HD" | "EX" => Ok(true),
        "NF" => Ok(false),
        _ => Err(answered(reply)),
    }
}

/// An answer memcached should not have given.
fn answered(reply: &str) -> io::Error {
    io::Error::other(format!("memcached answered {reply:?}"))
}

async fn in_time<T>(work: impl Future<Output = T>) -> io::Result<T> {
    tokio::time::timeout(TIMEOUT, work)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer in time"))
}
