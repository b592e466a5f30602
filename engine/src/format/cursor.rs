//! The one cursor the record decoders read with: little-endian fields in order, every read
//! bounds-checked, a short record an error naming it (`Corruption::Record`), never a panic.

use crate::error::{Corruption, Error, Result};
use crate::format::Timestamp;

/// Reads fields from `b` starting at `at`; `record` names what is read, for the error.
pub(crate) struct Cur<'a> {
    b: &'a [u8],
    at: usize,
    record: &'static str,
}

impl<'a> Cur<'a> {
    pub(crate) fn new(b: &'a [u8], at: usize, record: &'static str) -> Cur<'a> {
        Cur { b, at, record }
    }

    /// The error for this record, saying `why`.
    pub(crate) fn bad(&self, why: &str) -> Error {
        Corruption::Record {
            record: self.record,
            why: why.into(),
        }
        .into()
    }

    /// Bytes not read yet.
    pub(crate) fn left(&self) -> usize {
        self.b.len() - self.at
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| self.bad("a record runs past its end"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A timestamp as records store it: seconds (i64), then nanoseconds (u32).
    pub(crate) fn time(&mut self) -> Result<Timestamp> {
        let secs = self.i64()?;
        Ok(Timestamp {
            secs,
            nanos: self.u32()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_in_order_and_refuses_to_run_past_the_end() {
        let mut b = Vec::new();
        b.push(7u8);
        b.extend_from_slice(&0x0102u16.to_le_bytes());
        b.extend_from_slice(&(-5i64).to_le_bytes());
        b.extend_from_slice(&9u32.to_le_bytes());
        let mut c = Cur::new(&b, 0, "test");
        assert_eq!(c.u8().unwrap(), 7);
        assert_eq!(c.u16().unwrap(), 0x0102);
        let t = c.time().unwrap();
        assert_eq!((t.secs, t.nanos), (-5, 9));
        assert_eq!(c.left(), 0);
        match c.u8() {
            Err(Error::Corrupt(Corruption::Record { record, .. })) => assert_eq!(record, "test"),
            other => panic!("expected a record error, got {other:?}"),
        }
    }
}
