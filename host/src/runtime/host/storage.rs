//! `storage`: the family's own keyspace, and reads of the keyspaces it was
//! granted (`read`); any other keyspace fails closed.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::storage;
use crate::store::StorageError;

fn to_wit(e: StorageError) -> storage::StorageError {
    match e {
        StorageError::ReadOnly => storage::StorageError::ReadOnly,
        StorageError::UnknownKeyspace(k) => storage::StorageError::UnknownKeyspace(k),
        StorageError::TooLarge(m) => storage::StorageError::TooLarge(m),
        StorageError::Internal(m) => storage::StorageError::Internal(m),
        // The host runs the whole request again, whatever the plugin does.
        StorageError::Conflict => {
            storage::StorageError::Internal("conflict with a concurrent request".into())
        }
    }
}

/// Append `bytes` with its little-endian u32 length (the packed form).
fn pack(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    buf.extend_from_slice(bytes);
}

impl Ctx {
    /// The keyspace a read names: the own one, or a granted one.
    fn keyspace(&self, requested: Option<String>) -> Result<String, storage::StorageError> {
        match requested {
            None => Ok(self.family.clone()),
            Some(k) if k == self.family || self.grants.reads.contains(&k) => Ok(k),
            Some(k) => {
                let known = self.rt.as_ref().is_some_and(|rt| rt.grants(&k).is_some());
                if known {
                    tracing::warn!(family = %self.family, keyspace = %k, "read of a keyspace not granted: refused");
                    Err(storage::StorageError::Forbidden(k))
                } else {
                    Err(storage::StorageError::UnknownKeyspace(k))
                }
            }
        }
    }
}

impl Ctx {
    /// Most bytes one storage call may return (`max_call_bytes`).
    fn call_budget(&self) -> usize {
        self.rt.as_ref().map_or(0, |rt| rt.config.max_call_bytes)
    }
}

impl storage::Host for Ctx {
    async fn get(
        &mut self,
        keyspace: Option<String>,
        key: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, storage::StorageError> {
        let ks = self.keyspace(keyspace)?;
        self.ready().await;
        self.on_txn(|t| t.get(&ks, &key)).map_err(to_wit)
    }

    async fn get_many(
        &mut self,
        keyspace: Option<String>,
        keys: Vec<Vec<u8>>,
    ) -> Result<Vec<Option<Vec<u8>>>, storage::StorageError> {
        if keys.len() > crate::store::MAX_GET_MANY {
            return Err(storage::StorageError::TooLarge(format!(
                "at most {} keys per get-many",
                crate::store::MAX_GET_MANY
            )));
        }
        let ks = self.keyspace(keyspace)?;
        self.ready().await;
        let budget = self.call_budget();
        self.on_txn(|t| t.get_many(&ks, &keys, budget))
            .map_err(to_wit)
    }

    async fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), storage::StorageError> {
        let ks = self.family.clone();
        self.ready().await;
        self.txn()
            .and_then(|t| t.put(&ks, &key, &value))
            .map_err(to_wit)
    }

    async fn delete(&mut self, key: Vec<u8>) -> Result<bool, storage::StorageError> {
        let ks = self.family.clone();
        self.ready().await;
        self.on_txn(|t| t.delete(&ks, &key)).map_err(to_wit)
    }

    async fn scan(
        &mut self,
        keyspace: Option<String>,
        start: Vec<u8>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: u32,
    ) -> Result<Vec<storage::Entry>, storage::StorageError> {
        let ks = self.keyspace(keyspace)?;
        let limit = limit.min(100_000) as usize;
        self.ready().await;
        let budget = self.call_budget();
        let rows = self
            .on_txn(|t| t.scan_bounded(&ks, &start, end.as_deref(), reverse, limit, budget))
            .map_err(to_wit)?;
        Ok(rows
            .into_iter()
            .map(|(key, value)| storage::Entry { key, value })
            .collect())
    }

    async fn scan_packed(
        &mut self,
        keyspace: Option<String>,
        start: Vec<u8>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: u32,
    ) -> Result<Vec<u8>, storage::StorageError> {
        let rows = self.scan(keyspace, start, end, reverse, limit).await?;
        let size = rows.iter().map(|e| 8 + e.key.len() + e.value.len()).sum();
        let mut buf = Vec::with_capacity(size);
        for e in &rows {
            pack(&mut buf, &e.key);
            pack(&mut buf, &e.value);
        }
        Ok(buf)
    }

    async fn get_many_packed(
        &mut self,
        keyspace: Option<String>,
        keys: Vec<Vec<u8>>,
    ) -> Result<Vec<u8>, storage::StorageError> {
        let values = self.get_many(keyspace, keys).await?;
        let size = values
            .iter()
            .map(|v| 4 + v.as_ref().map_or(0, Vec::len))
            .sum();
        let mut buf = Vec::with_capacity(size);
        for v in &values {
            match v {
                Some(v) => pack(&mut buf, v),
                None => buf.extend_from_slice(&u32::MAX.to_le_bytes()),
            }
        }
        Ok(buf)
    }
}
