//! A 64-bit digest of anything that serializes, in which empty maps, empty lists and nulls count
//! as absent (an apply that sets `resources: {}` leaves nothing the API server keeps) and a map's
//! order does not count: a typed object and its JSON have the same digest, computed as it
//! serializes, without building the JSON.
//!
//! A map's digest combines its entries' digests by a wrapping sum, so that struct fields (in
//! declaration order) and JSON maps (sorted) agree without sorting.
//!
//! An owned object's spec is digested with placeholders for the strings that name it (its name,
//! its owner's uid) wherever a string value is exactly one of them (`digest_naming`): objects
//! alike but for their names then have one spec digest, which a watch finds again instead of
//! walking each spec (managed_fields.rs).

use std::fmt::Display;
use std::hash::{BuildHasher, Hash, Hasher};

use foldhash::quality::{FixedState, FoldHasher};

use serde::ser::{self, Serialize};

/// The digest of `value`; `None` when it is absent (null, or empty all the way down).
pub fn digest<T: Serialize + ?Sized>(value: &T) -> Option<u64> {
    value.serialize(Digester::default()).unwrap_or(Some(0))
}

/// The same with a placeholder for each string value that is exactly one of `names` (empty
/// ones name nothing).
pub fn digest_naming<T: Serialize + ?Sized>(value: &T, names: &[&str]) -> Option<u64> {
    value.serialize(Digester { names }).unwrap_or(Some(0))
}

/// A string value's digest, as `digest_naming` makes it.
pub fn string_digest(value: &str, names: &[&str]) -> Option<u64> {
    match names
        .iter()
        .position(|name| *name == value && !name.is_empty())
    {
        Some(placeholder) => leaf(NAME, placeholder),
        None => leaf(STRING, value),
    }
}

/// The digest of a map of these entries, as `digest` makes it for a map.
pub fn map_digest<'a>(entries: impl IntoIterator<Item = (&'a str, Option<u64>)>) -> Option<u64> {
    let mut map = MapDigest::default();
    for (key, value) in entries {
        map.entry(key, value);
    }
    map.finish()
}

/// The hash every digest is made with. Digests are compared only within one process, so any
/// fixed seed will do; foldhash is several times faster than std's SipHash on these short inputs.
pub(super) fn hasher() -> FoldHasher<'static> {
    FixedState::default().build_hasher()
}

fn leaf(tag: u8, value: impl Hash) -> Option<u64> {
    let mut hasher = hasher();
    (tag, value).hash(&mut hasher);
    Some(hasher.finish())
}

/// A map key's digest: the string's.
fn key_digest(key: &str) -> u64 {
    leaf(STRING, key).unwrap_or_default()
}

const STRING: u8 = 4;
const NAME: u8 = 8;

/// A map's digest, entry by entry.
#[derive(Default)]
pub struct MapDigest {
    sum: u64,
    entries: u64,
}

impl MapDigest {
    /// Adds the entry `key` of a value with this digest.
    pub fn entry(&mut self, key: &str, value: Option<u64>) {
        self.add(key_digest(key), value);
    }

    fn add(&mut self, key: u64, value: Option<u64>) {
        if let Some(value) = value {
            let mut hasher = hasher();
            (key, value).hash(&mut hasher);
            self.sum = self.sum.wrapping_add(hasher.finish());
            self.entries += 1;
        }
    }

    pub fn finish(self) -> Option<u64> {
        if self.entries == 0 {
            return None;
        }
        leaf(5, (self.sum, self.entries))
    }
}

/// A list's digest, item by item.
pub struct SeqDigest {
    hasher: FoldHasher<'static>,
    items: u64,
}

impl Default for SeqDigest {
    fn default() -> Self {
        Self {
            hasher: hasher(),
            items: 0,
        }
    }
}

impl SeqDigest {
    pub fn add(&mut self, item: Option<u64>) {
        // An absent item still holds its place.
        item.unwrap_or(0).hash(&mut self.hasher);
        self.items += 1;
    }

    pub fn finish(mut self) -> Option<u64> {
        (self.items > 0).then(|| {
            (6u8, self.items).hash(&mut self.hasher);
            self.hasher.finish()
        })
    }
}

#[derive(Debug)]
pub struct Error(String);

impl Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

/// Serializes a value into its digest; `names`, the placeholders' (see `digest_naming`).
#[derive(Clone, Copy, Default)]
struct Digester<'n> {
    names: &'n [&'n str],
}

/// A list's, struct's or map's digest as it serializes, with the digester of its items.
pub struct Compound<'n, S> {
    digest: S,
    digester: Digester<'n>,
}

impl<'n, S: Default> Compound<'n, S> {
    fn of(digester: Digester<'n>) -> Self {
        Self {
            digest: S::default(),
            digester,
        }
    }
}

type Out = Result<Option<u64>, Error>;

impl<'n> ser::Serializer for Digester<'n> {
    type Ok = Option<u64>;
    type Error = Error;
    type SerializeSeq = Compound<'n, SeqDigest>;
    type SerializeTuple = Compound<'n, SeqDigest>;
    type SerializeTupleStruct = Compound<'n, SeqDigest>;
    type SerializeTupleVariant = Variant<Compound<'n, SeqDigest>>;
    type SerializeMap = Compound<'n, MapEntries>;
    type SerializeStruct = Compound<'n, MapDigest>;
    type SerializeStructVariant = Variant<Compound<'n, MapDigest>>;

    fn serialize_bool(self, v: bool) -> Out {
        Ok(leaf(1, v))
    }
    fn serialize_i8(self, v: i8) -> Out {
        self.serialize_i128(v.into())
    }
    fn serialize_i16(self, v: i16) -> Out {
        self.serialize_i128(v.into())
    }
    fn serialize_i32(self, v: i32) -> Out {
        self.serialize_i128(v.into())
    }
    fn serialize_i64(self, v: i64) -> Out {
        self.serialize_i128(v.into())
    }
    fn serialize_i128(self, v: i128) -> Out {
        Ok(leaf(2, v))
    }
    fn serialize_u8(self, v: u8) -> Out {
        self.serialize_i128(v.into())
    }
    fn serialize_u16(self, v: u16) -> Out {
        self.serialize_i128(v.into())
    }
    fn serialize_u32(self, v: u32) -> Out {
        self.serialize_i128(v.into())
    }
    fn serialize_u64(self, v: u64) -> Out {
        self.serialize_i128(v.into())
    }
    fn serialize_f32(self, v: f32) -> Out {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Out {
        Ok(leaf(3, v.to_bits()))
    }
    fn serialize_char(self, v: char) -> Out {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Out {
        Ok(string_digest(v, self.names))
    }
    fn serialize_bytes(self, v: &[u8]) -> Out {
        Ok(leaf(7, v))
    }
    fn serialize_none(self) -> Out {
        Ok(None)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Out {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Out {
        Ok(None)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Out {
        Ok(None)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Out {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Out {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Out {
        Ok(map_digest([(variant, value.serialize(self)?)]))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Ok(Compound::of(self))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        Ok(Compound::of(self))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Ok(Compound::of(self))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Ok(Variant(variant, Compound::of(self)))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Ok(Compound::of(self))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        Ok(Compound::of(self))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Ok(Variant(variant, Compound::of(self)))
    }
}

impl ser::SerializeSeq for Compound<'_, SeqDigest> {
    type Ok = Option<u64>;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.digest.add(value.serialize(self.digester)?);
        Ok(())
    }
    fn end(self) -> Out {
        Ok(self.digest.finish())
    }
}

impl ser::SerializeTuple for Compound<'_, SeqDigest> {
    type Ok = Option<u64>;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Out {
        Ok(self.digest.finish())
    }
}

impl ser::SerializeTupleStruct for Compound<'_, SeqDigest> {
    type Ok = Option<u64>;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Out {
        Ok(self.digest.finish())
    }
}

impl ser::SerializeStruct for Compound<'_, MapDigest> {
    type Ok = Option<u64>;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.digest
            .add(key_digest(key), value.serialize(self.digester)?);
        Ok(())
    }
    fn end(self) -> Out {
        Ok(self.digest.finish())
    }
}

/// A map's entries: each key's digest is held until its value comes.
#[derive(Default)]
pub struct MapEntries {
    map: MapDigest,
    key: u64,
}

impl ser::SerializeMap for Compound<'_, MapEntries> {
    type Ok = Option<u64>;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        // JSON's keys are strings; a key of another kind is taken by its digest. A key is never
        // the placeholder.
        self.digest.key = key.serialize(Digester::default())?.unwrap_or_default();
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let value = value.serialize(self.digester)?;
        self.digest.map.add(self.digest.key, value);
        Ok(())
    }
    fn end(self) -> Out {
        Ok(self.digest.map.finish())
    }
}

/// An enum variant with fields: a map of its name to them, as serde_json writes it.
pub struct Variant<S>(&'static str, S);

impl ser::SerializeTupleVariant for Variant<Compound<'_, SeqDigest>> {
    type Ok = Option<u64>;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(&mut self.1, value)
    }
    fn end(self) -> Out {
        Ok(map_digest([(self.0, self.1.digest.finish())]))
    }
}

impl ser::SerializeStructVariant for Variant<Compound<'_, MapDigest>> {
    type Ok = Option<u64>;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        ser::SerializeStruct::serialize_field(&mut self.1, key, value)
    }
    fn end(self) -> Out {
        Ok(map_digest([(self.0, self.1.digest.finish())]))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::memcached;
    use crate::resources;

    #[test]
    fn a_typed_object_and_its_json_have_one_digest() {
        let mc = memcached("cache", 3);
        let template = resources::pod_template(&mc, &resources::Images::new("memcached:1"));
        let service = resources::service(&mc);
        let budget = resources::pod_disruption_budget(&mc);
        assert_eq!(
            digest(&template),
            digest(&serde_json::to_value(&template).unwrap())
        );
        assert_eq!(
            digest(&service),
            digest(&serde_json::to_value(&service).unwrap())
        );
        assert_eq!(
            digest(&budget),
            digest(&serde_json::to_value(&budget).unwrap())
        );
        assert_ne!(digest(&template), digest(&service));
    }

    #[test]
    fn empty_maps_lists_and_nulls_count_as_absent_and_nothing_else_does() {
        assert_eq!(
            digest(&json!({"a": {}, "b": [], "c": null, "d": {"e": {}}, "n": 1})),
            digest(&json!({"n": 1}))
        );
        assert_eq!(digest(&json!({"a": {}})), None);
        for (one, other) in [
            (json!({"n": 1}), json!({"n": "1"})),
            (json!({"n": 1}), json!({"n": 1.0})),
            (json!({"a": ["x", "y"]}), json!({"a": ["y", "x"]})),
            (json!({"a": [{}]}), json!({"a": []})),
            (json!({"a": true}), json!({"a": false})),
            (json!({"a": {"b": 1}}), json!({"a": 1, "b": 1})),
            (json!({"a": 1, "b": 2}), json!({"a": 2, "b": 1})),
            (json!({"a": 1}), json!({"b": 1})),
        ] {
            assert_ne!(digest(&one), digest(&other), "{one} against {other}");
        }
    }

    #[test]
    fn a_map_made_of_digests_is_the_map_serialized() {
        let labels = json!({"app": "memcached"});
        assert_eq!(
            map_digest([("labels", digest(&labels)), ("annotations", None)]),
            digest(&json!({"labels": labels, "annotations": {}}))
        );
    }
}
