//! A connection that counts the statements executed through it, so that the cost of one call
//! (the dependency advance above all) can be asserted in tests as a number of round trips, on
//! every backend, without any logging or tracing set up. Counting is one integer increment per
//! statement, so it is always on.

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use sqlx::any::{Any, AnyQueryResult, AnyRow, AnyStatement, AnyTypeInfo};
use sqlx::{AnyConnection, Either, Execute, Executor, SqlStr};

/// A borrowed connection and the number of statements sent through it so far.
#[derive(Debug)]
pub(crate) struct Counted<'a> {
    conn: &'a mut AnyConnection,
    statements: u64,
}

impl<'a> Counted<'a> {
    pub(crate) fn new(conn: &'a mut AnyConnection) -> Counted<'a> {
        Counted {
            conn,
            statements: 0,
        }
    }

    /// The connection itself, for work that is not counted: the id allocator, whose block
    /// reservations are shared by many calls and do not belong to any one of them.
    pub(crate) fn uncounted(&mut self) -> &mut AnyConnection {
        self.conn
    }

    /// Counts `n` statements sent through [`Counted::uncounted`] that belong to the call.
    pub(crate) fn add(&mut self, n: u64) {
        self.statements += n;
    }

    /// Statements executed through this wrapper.
    pub(crate) fn statements(&self) -> u64 {
        self.statements
    }
}

// Every way of running a statement ends in `fetch_many` (execute, fetch, fetch_all) or
// `fetch_optional` (fetch_one), so counting those two counts each statement once.
impl<'c> Executor<'c> for &'c mut Counted<'_> {
    type Database = Any;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<AnyQueryResult, AnyRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Any>,
    {
        self.statements += 1;
        (&mut *self.conn).fetch_many(query)
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<AnyRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Any>,
    {
        self.statements += 1;
        (&mut *self.conn).fetch_optional(query)
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [AnyTypeInfo],
    ) -> BoxFuture<'e, Result<AnyStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        (&mut *self.conn).prepare_with(sql, parameters)
    }
}
