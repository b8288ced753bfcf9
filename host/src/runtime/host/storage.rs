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
        StorageError::DiskFull => storage::StorageError::Internal("the disk is full".into()),
        // The host runs the whole request again, whatever the plugin does.
        StorageError::Conflict => {
            storage::StorageError::Internal("conflict with a concurrent request".into())
        }
    }
}

impl Ctx {
    /// The keyspace a read names: the own one, or a granted one.
    fn keyspace(&self, requested: Option<String>) -> Result<String, storage::StorageError> {
        match requested {
            None => Ok(self.family.clone()),
            Some(k) if k == self.family || self.grants.reads.contains(&k) => Ok(k),
            Some(k) => {
                let known = self.rt.as_ref().is_some_and(|rt| rt.configured(&k));
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

/// A get-many names at most [`crate::store::MAX_GET_MANY`] keys.
fn count_keys(keys: &[Vec<u8>]) -> Result<(), storage::StorageError> {
    if keys.len() > crate::store::MAX_GET_MANY {
        return Err(storage::StorageError::TooLarge(format!(
            "at most {} keys per get-many",
            crate::store::MAX_GET_MANY
        )));
    }
    Ok(())
}

/// Most rows one scan reads.
fn scan_limit(limit: u32) -> usize {
    limit.min(100_000) as usize
}

impl storage::Host for Ctx {
    async fn get(
        &mut self,
        keyspace: Option<String>,
        key: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, storage::StorageError> {
        let ks = self.keyspace(keyspace)?;
        self.ready().await;
        self.txn().and_then(|t| t.get(&ks, &key)).map_err(to_wit)
    }

    async fn get_many(
        &mut self,
        keyspace: Option<String>,
        keys: Vec<Vec<u8>>,
    ) -> Result<Vec<Option<Vec<u8>>>, storage::StorageError> {
        count_keys(&keys)?;
        let ks = self.keyspace(keyspace)?;
        self.ready().await;
        let budget = self.call_budget();
        self.txn()
            .and_then(|t| t.get_many(&ks, &keys, budget))
            .map_err(to_wit)
    }

    async fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), storage::StorageError> {
        let ks = self.family.clone();
        self.ready().await;
        self.txn()
            .and_then(|t| t.put_owned(&ks, key, value))
            .map_err(to_wit)
    }

    async fn delete(&mut self, key: Vec<u8>) -> Result<bool, storage::StorageError> {
        let ks = self.family.clone();
        self.ready().await;
        self.txn().and_then(|t| t.delete(&ks, &key)).map_err(to_wit)
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
        let limit = scan_limit(limit);
        self.ready().await;
        let budget = self.call_budget();
        let rows = self
            .txn()
            .and_then(|t| t.scan_bounded(&ks, &start, end.as_deref(), reverse, limit, budget))
            .map_err(to_wit)?;
        Ok(rows
            .into_iter()
            .map(|(key, value)| storage::Entry { key, value })
            .collect())
    }

    /// Rows are copied from the database into the packed buffer as read.
    async fn scan_packed(
        &mut self,
        keyspace: Option<String>,
        start: Vec<u8>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: u32,
    ) -> Result<Vec<u8>, storage::StorageError> {
        let ks = self.keyspace(keyspace)?;
        let limit = scan_limit(limit);
        self.ready().await;
        let budget = self.call_budget();
        self.txn()
            .and_then(|t| t.scan_packed(&ks, &start, end.as_deref(), reverse, limit, budget))
            .map_err(to_wit)
    }

    /// Values are copied from the database into the packed buffer as read.
    async fn get_many_packed(
        &mut self,
        keyspace: Option<String>,
        keys: Vec<Vec<u8>>,
    ) -> Result<Vec<u8>, storage::StorageError> {
        count_keys(&keys)?;
        let ks = self.keyspace(keyspace)?;
        self.ready().await;
        let budget = self.call_budget();
        self.txn()
            .and_then(|t| t.get_many_packed(&ks, &keys, budget))
            .map_err(to_wit)
    }
}
