//! Reading by table name ([`Kv`]), the same for committed data and for a
//! request's own view, and where the rows read go: owned copies, or the
//! packed buffer a plugin reads ([`Packed`]), within a byte budget.

use super::{Rows, StorageError};

/// Reading by table name: committed data (a read transaction) or a
/// request's view (its overlay over the batch).
pub trait Kv {
    fn get_in(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;
    /// Several keys of one table, in order, into `out`; refused
    /// (`TooLarge`) as soon as the values read pass `max_bytes` (what `out`
    /// holds then is to be dropped).
    fn get_many_into(
        &self,
        table: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
        out: &mut dyn ValueSink,
    ) -> Result<(), StorageError>;
    /// [`Kv::get_many_into`], copied out.
    fn get_many_within(
        &self,
        table: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
    ) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        let mut values = Vec::with_capacity(keys.len());
        self.get_many_into(table, keys, max_bytes, &mut values)?;
        Ok(values)
    }
    /// Several keys of one table, in order.
    fn get_many_in(
        &self,
        table: &str,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        self.get_many_within(table, keys, usize::MAX)
    }
    /// Ordered scan of [start, end) into `out`, reversed when asked, at
    /// most `limit` rows; refused (`TooLarge`) as soon as the rows pass
    /// `max_bytes` (what `out` holds then is to be dropped).
    #[allow(clippy::too_many_arguments)]
    fn scan_into(
        &self,
        table: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
        max_bytes: usize,
        out: &mut dyn RowSink,
    ) -> Result<(), StorageError>;
    /// [`Kv::scan_into`], copied out.
    fn scan_within(
        &self,
        table: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Rows, StorageError> {
        let mut rows = Rows::new();
        self.scan_into(table, start, end, reverse, limit, max_bytes, &mut rows)?;
        Ok(rows)
    }
    /// Ordered scan of [start, end), reversed when asked, at most `limit`.
    fn scan_in(
        &self,
        table: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Rows, StorageError> {
        self.scan_within(table, start, end, reverse, limit, usize::MAX)
    }
}

/// Where a scan's rows go: owned copies ([`Rows`]), or [`Packed`].
pub trait RowSink {
    fn row(&mut self, key: &[u8], value: &[u8]);
}

/// Where the values of several keys go: owned copies, or [`Packed`].
pub trait ValueSink {
    fn value(&mut self, value: Option<&[u8]>);
    /// A value the reader already owns (the shared store's answers).
    fn owned(&mut self, value: Option<Vec<u8>>) {
        self.value(value.as_deref());
    }
}

impl RowSink for Rows {
    fn row(&mut self, key: &[u8], value: &[u8]) {
        self.push((key.to_vec(), value.to_vec()));
    }
}

impl ValueSink for Vec<Option<Vec<u8>>> {
    fn value(&mut self, value: Option<&[u8]>) {
        self.push(value.map(<[u8]>::to_vec));
    }
    fn owned(&mut self, value: Option<Vec<u8>>) {
        self.push(value);
    }
}

/// Rows or values in the packed form a plugin reads as one buffer (the
/// `*-packed` storage calls): each key and value as its little-endian u32
/// length and its bytes, a missing value as the length `u32::MAX`. On the
/// embedded store a row is copied from the database page into it, with no
/// owned copy of each row in between.
pub(super) struct Packed(pub(super) Vec<u8>);

impl Default for Packed {
    /// Room for a typical answer (a search's 20 records) in one allocation.
    fn default() -> Self {
        Packed(Vec::with_capacity(16 << 10))
    }
}

impl Packed {
    fn put(&mut self, bytes: &[u8]) {
        self.0
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.0.extend_from_slice(bytes);
    }
}

impl RowSink for Packed {
    fn row(&mut self, key: &[u8], value: &[u8]) {
        self.put(key);
        self.put(value);
    }
}

impl ValueSink for Packed {
    fn value(&mut self, value: Option<&[u8]>) {
        match value {
            Some(v) => self.put(v),
            None => self.0.extend_from_slice(&u32::MAX.to_le_bytes()),
        }
    }
}

/// Bytes a storage call may still return.
pub(super) struct Budget {
    max: usize,
    used: usize,
}

impl Budget {
    pub(super) fn new(max: usize) -> Budget {
        Budget { max, used: 0 }
    }

    /// Count `n` more bytes; refused once over the budget.
    pub(super) fn take(&mut self, n: usize) -> Result<(), StorageError> {
        self.used = self.used.saturating_add(n);
        if self.used > self.max {
            return Err(StorageError::TooLarge(format!(
                "the answer would pass {} bytes; ask for fewer rows or keys",
                self.max
            )));
        }
        Ok(())
    }
}
