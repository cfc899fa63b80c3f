//! A request body read as its top-level members, each kept raw until its field is checked, so a
//! bad member is refused by name and an unknown one is seen before any is parsed.

use super::*;

/// An object key, borrowed from the body unless it holds escapes.
pub(super) struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Cow<'de, str>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(s))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
                Ok(Cow::Owned(s))
            }
        }
        d.deserialize_str(V)
    }
}

/// A request body's top-level members, each value still its JSON text: the body is scanned
/// once, its keys checked against the field table, and each value parsed straight into its
/// field's type (no `serde_json::Value` tree of the whole body in between).
pub struct Members<'a>(pub(super) Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Members<'de>, A::Error> {
                let mut out = Vec::with_capacity(16);
                while let Some(k) = m.next_key_seed(Key)? {
                    out.push((k, m.next_value::<&'de RawValue>()?));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'a> Members<'a> {
    /// The members of a body that must be one JSON object, each member once.
    pub fn parse(body: &'a [u8]) -> Result<Self, ApiError> {
        let m: Members = serde_json::from_slice(body).map_err(|e| {
            if e.is_data() {
                ApiError::bad_request("the body must be a JSON object", None)
            } else {
                ApiError::bad_request(format!("invalid JSON body: {e}"), None)
            }
        })?;
        // A few members are compared pairwise; a body of many through a set (no quadratic
        // work for a megabyte of keys).
        let keys = || m.0.iter().map(|(k, _)| k);
        let twice = if m.0.len() <= 32 {
            keys()
                .enumerate()
                .find(|&(i, k)| keys().take(i).any(|earlier| earlier == k))
                .map(|(_, k)| k)
        } else {
            let mut seen = std::collections::HashSet::with_capacity(m.0.len());
            keys().find(|&k| !seen.insert(&**k))
        };
        if let Some(k) = twice {
            return Err(ApiError::bad_field(
                format!("`{k}` appears twice in the body: send it once"),
                k.to_string(),
            ));
        }
        Ok(m)
    }

    /// The members as `T` (members `T` does not name are skipped). A value of the wrong type
    /// is a 400 naming its member.
    pub fn typed<T: Deserialize<'a>>(&self) -> Result<T, ApiError> {
        let at = Cell::new("");
        let members = self.0.iter().map(|(k, v)| {
            at.set(k);
            (&**k, *v)
        });
        T::deserialize(de::value::MapDeserializer::<_, serde_json::Error>::new(
            members,
        ))
        .map_err(|e| {
            // An error inside a value carries its position in that value's text; one of the
            // object (a missing or duplicate member) has none.
            if e.line() == 0 {
                return ApiError::bad_request(format!("invalid request body: {e}"), None);
            }
            member_error(at.get(), &e)
        })
    }
}

/// A 400 naming member `k`, whose value failed to parse with `e` (its position, inside that
/// value's own text, left out).
pub(super) fn member_error(k: &str, e: &serde_json::Error) -> ApiError {
    let e = e.to_string();
    let e = e.rsplit_once(" at line ").map_or(&*e, |(m, _)| m);
    ApiError::bad_field(format!("invalid request body: `{k}`: {e}"), k.to_string())
}
