//! The [`Store`](idemgate_core::Store) methods of a SQL store whose writes run on
//! its pool, written once: [`sql_store_methods!`](crate::sql_store_methods) expands
//! them in the store's crate, on its concrete `sqlx` types. PostgreSQL uses it;
//! SQLite does not (its writes go through one writer connection, batched).
//!
//! A macro, not generic functions, because what they do — execute a statement on a
//! pool and count the rows it changed — has no generic form in `sqlx`
//! (`QueryResult::rows_affected` belongs to each driver). What differs between the
//! dialects stays in the store: the SQL text, the claim, the clock, the migration.

/// Implements, for a SQL store type, everything around its statements that both SQL
/// stores share: the [`Store`](idemgate_core::Store) impl (its `try_claim` calls
/// the store's own `claim`), the fenced writes, the read, the purge and the change
/// signals.
///
/// The store type must have `inner.pool` (its `sqlx` pool), `inner.signals`
/// ([`ChangeSignals`](idemgate_core::signals::ChangeSignals)) and `inner.sql` with
/// `Arc<str>` statements `complete`, `release`, `renew`, `delete` (fenced on
/// parameters 1–3: identity, operation id, token; `renew`'s 4th is the lease in
/// milliseconds, `complete`'s 4th–9th the [`CompletionColumns`](crate::CompletionColumns)),
/// `read` (parameter 1: identity), `purge` (parameter 1: the batch size),
/// `acquire_resource_lease` (parameters: resource, proposed token, ttl in
/// milliseconds; one statement returning the row's `token`, `until_ms` and
/// `now_ms`, see [`decode_lease_acquisition`](crate::decode_lease_acquisition))
/// and `release_resource_lease` (parameters: resource, token; deletes the live
/// lease holding that token); an
/// inherent `async fn claim(&self, &ClaimRequest) -> Result<Claim, StoreError>`
/// and an inherent `async fn evict_record(&self, &IdentityDigest, EvictMode) ->
/// Result<Eviction, StoreError>` (the conditional delete, whose atomicity each
/// dialect gets its own way);
/// the inherent journal methods `audit_append`, `audit_read`,
/// `audit_partitions_of`, `audit_trim` and `audit_secret_of` (the `Store`'s
/// `append_audit`, `read_audit`, `audit_partitions`, `trim_audit` and
/// `audit_secret`: each dialect chains and locks its own way);
/// the inherent `pieces_append` and `pieces_read` (the `Store`'s
/// `append_stream_piece` and `read_stream_pieces`, in-process signal included);
/// an inherent `async fn wait_announced(&self, &IdentityDigest, Duration)` (its
/// [`Store::wait_for_change`](idemgate_core::Store::wait_for_change): in-process
/// signals plus however the dialect hears other instances);
/// and an impl of [`SqlStore`](crate::SqlStore), whose `Database` and error codes
/// the expansion uses ([`store_error`](crate::store_error)).
///
/// The expansion adds the inherent methods `complete_on` (the fenced completion on
/// a connection, for [`SqlStore::complete_in`](crate::SqlStore::complete_in)),
/// `purge_now`, `spawn_purge_task` and `signals`.
#[macro_export]
macro_rules! sql_store_methods {
    ($store:ty) => {
        impl $store {
            /// The fenced completion, for the pool or a transaction: `sql`
            /// (the store's completion statement, or one that begins with it)
            /// with the completion's parameters, `$1` to `$9`, bound.
            pub(crate) fn complete_query(
                &self,
                sql: &::std::sync::Arc<str>,
                lease: &$crate::__private::idemgate_core::Lease,
                completion: &$crate::__private::idemgate_core::Completion,
            ) -> ::std::option::Option<
                $crate::__private::sqlx::query::Query<
                    'static,
                    <$store as $crate::SqlStore>::Database,
                    <<$store as $crate::SqlStore>::Database as $crate::__private::sqlx::Database>::Arguments,
                >,
            > {
                let token = $crate::token_param(lease.token)?;
                let columns = $crate::CompletionColumns::of(completion);
                ::std::option::Option::Some(
                    $crate::__private::sqlx::query($crate::__private::sqlx::AssertSqlSafe(
                        ::std::sync::Arc::clone(sql),
                    ))
                    .bind(lease.identity.as_bytes().to_vec())
                    .bind(lease.operation_id.as_uuid())
                    .bind(token)
                    .bind(columns.status)
                    .bind(i32::from(columns.response_status))
                    .bind(columns.headers)
                    .bind(columns.body.map(::std::borrow::Cow::into_owned))
                    .bind(columns.retained)
                    .bind(columns.ttl_ms),
                )
            }

            /// The fenced completion on `connection` (a business transaction),
            /// without committing.
            pub(crate) async fn complete_on(
                &self,
                connection: &mut <<$store as $crate::SqlStore>::Database as $crate::__private::sqlx::Database>::Connection,
                lease: &$crate::__private::idemgate_core::Lease,
                completion: &$crate::__private::idemgate_core::Completion,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::FencedWrite,
                $crate::__private::idemgate_core::StoreError,
            > {
                let ::std::option::Option::Some(query) = self.complete_query(&self.inner.sql.complete, lease, completion)
                else {
                    return ::std::result::Result::Ok(
                        $crate::__private::idemgate_core::FencedWrite::Refused,
                    );
                };
                let done = query
                    .execute(connection)
                    .await
                    .map_err($crate::store_error::<$store>)?;
                ::std::result::Result::Ok($crate::applied(done.rows_affected()))
            }

            /// Runs a fenced statement whose parameters are the fence (1–3) and,
            /// optionally, one more integer; wakes in-process waiters when it
            /// applied and `notify` says the record changed for them.
            async fn fenced(
                &self,
                sql: &::std::sync::Arc<str>,
                lease: &$crate::__private::idemgate_core::Lease,
                extra: ::std::option::Option<i64>,
                notify: bool,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::FencedWrite,
                $crate::__private::idemgate_core::StoreError,
            > {
                let ::std::option::Option::Some(token) = $crate::token_param(lease.token) else {
                    return ::std::result::Result::Ok(
                        $crate::__private::idemgate_core::FencedWrite::Refused,
                    );
                };
                let mut query = $crate::__private::sqlx::query(
                    $crate::__private::sqlx::AssertSqlSafe(::std::sync::Arc::clone(sql)),
                )
                .bind(lease.identity.as_bytes().to_vec())
                .bind(lease.operation_id.as_uuid())
                .bind(token);
                if let ::std::option::Option::Some(extra) = extra {
                    query = query.bind(extra);
                }
                let done = query
                    .execute(&self.inner.pool)
                    .await
                    .map_err($crate::store_error::<$store>)?;
                let write = $crate::applied(done.rows_affected());
                if notify && write == $crate::__private::idemgate_core::FencedWrite::Applied {
                    self.inner.signals.notify(&lease.identity);
                }
                ::std::result::Result::Ok(write)
            }

            async fn read(
                &self,
                identity: &$crate::__private::idemgate_core::scope::IdentityDigest,
            ) -> ::std::result::Result<
                ::std::option::Option<$crate::__private::idemgate_core::Snapshot>,
                $crate::__private::idemgate_core::StoreError,
            > {
                let row = $crate::__private::sqlx::query($crate::__private::sqlx::AssertSqlSafe(
                    ::std::sync::Arc::clone(&self.inner.sql.read),
                ))
                .bind(identity.as_bytes().to_vec())
                .fetch_optional(&self.inner.pool)
                .await
                .map_err($crate::store_error::<$store>)?;
                row.as_ref().map($crate::decode_snapshot).transpose()
            }

            /// Deletes expired records in batches of at most `batch`.
            async fn purge_now(
                &self,
                batch: usize,
            ) -> ::std::result::Result<u64, $crate::__private::idemgate_core::StoreError> {
                $crate::purge_in_batches(batch, |limit| async move {
                    $crate::__private::sqlx::query($crate::__private::sqlx::AssertSqlSafe(
                        ::std::sync::Arc::clone(&self.inner.sql.purge),
                    ))
                    .bind(limit)
                    .execute(&self.inner.pool)
                    .await
                    .map(|done| done.rows_affected())
                    .map_err($crate::store_error::<$store>)
                })
                .await
            }

            /// Runs the store's `purge_expired` (the journalled purge when the
            /// journal is on, else [`Self::purge_now`]) every `every` on the
            /// current runtime.
            fn spawn_purge_task(
                &self,
                every: ::std::time::Duration,
                batch: usize,
            ) -> ::std::result::Result<
                $crate::PurgeTask,
                $crate::__private::tokio::runtime::TryCurrentError,
            > {
                let store = ::std::clone::Clone::clone(self);
                $crate::PurgeTask::spawn(every, move || {
                    let store = ::std::clone::Clone::clone(&store);
                    async move { store.purge_expired(batch).await }
                })
            }

            pub(crate) fn signals(&self) -> &$crate::__private::idemgate_core::signals::ChangeSignals {
                &self.inner.signals
            }
        }

        #[$crate::__private::async_trait::async_trait]
        impl $crate::__private::idemgate_core::Store for $store {
            async fn try_claim(
                &self,
                request: &$crate::__private::idemgate_core::ClaimRequest,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::Claim,
                $crate::__private::idemgate_core::StoreError,
            > {
                self.claim(request).await
            }

            fn supports_one_transaction(&self) -> bool {
                true
            }

            async fn claim_in_transaction(
                &self,
                request: &$crate::__private::idemgate_core::ClaimRequest,
                lock_wait: ::std::time::Duration,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::transaction::ClaimInTransaction,
                $crate::__private::idemgate_core::StoreError,
            > {
                $crate::claim_in_transaction(self, request, lock_wait).await
            }

            async fn complete(
                &self,
                lease: &$crate::__private::idemgate_core::Lease,
                completion: &$crate::__private::idemgate_core::Completion,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::FencedWrite,
                $crate::__private::idemgate_core::StoreError,
            > {
                let mut connection = self
                    .inner
                    .pool
                    .acquire()
                    .await
                    .map_err($crate::store_error::<$store>)?;
                let write = self.complete_on(&mut connection, lease, completion).await?;
                if write == $crate::__private::idemgate_core::FencedWrite::Applied {
                    self.inner.signals.notify(&lease.identity);
                }
                ::std::result::Result::Ok(write)
            }

            async fn release(
                &self,
                lease: &$crate::__private::idemgate_core::Lease,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::FencedWrite,
                $crate::__private::idemgate_core::StoreError,
            > {
                self.fenced(&self.inner.sql.release, lease, None, true).await
            }

            async fn renew(
                &self,
                lease: &$crate::__private::idemgate_core::Lease,
                lease_for: ::std::time::Duration,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::FencedWrite,
                $crate::__private::idemgate_core::StoreError,
            > {
                self.fenced(&self.inner.sql.renew, lease, Some($crate::millis(lease_for)), false)
                    .await
            }

            async fn delete(
                &self,
                lease: &$crate::__private::idemgate_core::Lease,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::FencedWrite,
                $crate::__private::idemgate_core::StoreError,
            > {
                self.fenced(&self.inner.sql.delete, lease, None, true).await
            }

            async fn evict(
                &self,
                identity: &$crate::__private::idemgate_core::scope::IdentityDigest,
                mode: $crate::__private::idemgate_core::EvictMode,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::Eviction,
                $crate::__private::idemgate_core::StoreError,
            > {
                let eviction = self.evict_record(identity, mode).await?;
                if ::std::matches!(
                    eviction,
                    $crate::__private::idemgate_core::Eviction::Evicted { .. }
                ) {
                    self.inner.signals.notify(identity);
                }
                ::std::result::Result::Ok(eviction)
            }

            async fn get(
                &self,
                identity: &$crate::__private::idemgate_core::scope::IdentityDigest,
            ) -> ::std::result::Result<
                ::std::option::Option<$crate::__private::idemgate_core::Snapshot>,
                $crate::__private::idemgate_core::StoreError,
            > {
                self.read(identity).await
            }

            async fn acquire_resource_lease(
                &self,
                resource: &$crate::__private::idemgate_core::resource_lease::ResourceId,
                ttl: ::std::time::Duration,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::resource_lease::LeaseAcquisition,
                $crate::__private::idemgate_core::StoreError,
            > {
                let token = $crate::__private::idemgate_core::resource_lease::LeaseToken::random();
                let row = $crate::__private::sqlx::query($crate::__private::sqlx::AssertSqlSafe(
                    ::std::sync::Arc::clone(&self.inner.sql.acquire_resource_lease),
                ))
                .bind(resource.as_bytes().to_vec())
                .bind(token.as_bytes().to_vec())
                .bind($crate::millis(ttl))
                .fetch_one(&self.inner.pool)
                .await
                .map_err($crate::store_error::<$store>)?;
                $crate::decode_lease_acquisition(&row, *resource, token)
            }

            async fn release_resource_lease(
                &self,
                lease: &$crate::__private::idemgate_core::resource_lease::ResourceLease,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::FencedWrite,
                $crate::__private::idemgate_core::StoreError,
            > {
                let done = $crate::__private::sqlx::query($crate::__private::sqlx::AssertSqlSafe(
                    ::std::sync::Arc::clone(&self.inner.sql.release_resource_lease),
                ))
                .bind(lease.resource.as_bytes().to_vec())
                .bind(lease.token.as_bytes().to_vec())
                .execute(&self.inner.pool)
                .await
                .map_err($crate::store_error::<$store>)?;
                ::std::result::Result::Ok($crate::applied(done.rows_affected()))
            }

            fn journal_expiries(&self, journal: $crate::__private::idemgate_core::audit::ExpiryJournal) {
                self.journal_expiries_of(journal);
            }

            async fn append_audit(
                &self,
                records: &[$crate::__private::idemgate_core::audit::AuditRecord],
            ) -> ::std::result::Result<(), $crate::__private::idemgate_core::StoreError> {
                self.audit_append(records).await
            }

            async fn read_audit(
                &self,
                query: &$crate::__private::idemgate_core::audit::AuditQuery,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::__private::idemgate_core::audit::AuditEntry>, $crate::__private::idemgate_core::StoreError> {
                self.audit_read(query).await
            }

            async fn audit_partitions(
                &self,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::__private::idemgate_core::audit::AuditPartition>, $crate::__private::idemgate_core::StoreError> {
                self.audit_partitions_of().await
            }

            async fn trim_audit(
                &self,
                instance: ::std::option::Option<&str>,
                before: $crate::__private::idemgate_core::time::Timestamp,
                limit: usize,
            ) -> ::std::result::Result<u64, $crate::__private::idemgate_core::StoreError> {
                self.audit_trim(instance, before, limit).await
            }

            async fn audit_secret(
                &self,
            ) -> ::std::result::Result<$crate::__private::idemgate_core::audit::AuditSecret, $crate::__private::idemgate_core::StoreError> {
                self.audit_secret_of().await
            }

            async fn record_duration(
                &self,
                route: &str,
                duration: ::std::time::Duration,
            ) -> ::std::result::Result<(), $crate::__private::idemgate_core::StoreError> {
                self.durations_record(route, duration).await
            }

            async fn route_durations(
                &self,
                route: &str,
            ) -> ::std::result::Result<::std::vec::Vec<::std::time::Duration>, $crate::__private::idemgate_core::StoreError> {
                self.durations_of(route).await
            }

            async fn append_stream_piece(
                &self,
                lease: &$crate::__private::idemgate_core::Lease,
                index: u32,
                piece: &$crate::__private::bytes::Bytes,
            ) -> ::std::result::Result<
                $crate::__private::idemgate_core::FencedWrite,
                $crate::__private::idemgate_core::StoreError,
            > {
                self.pieces_append(lease, index, piece).await
            }

            async fn read_stream_pieces(
                &self,
                stream: &$crate::__private::idemgate_core::stream::StreamId,
                from: u32,
                limit: u32,
            ) -> ::std::result::Result<
                ::std::vec::Vec<$crate::__private::bytes::Bytes>,
                $crate::__private::idemgate_core::StoreError,
            > {
                self.pieces_read(stream, from, limit).await
            }

            async fn wait_for_change(
                &self,
                identity: &$crate::__private::idemgate_core::scope::IdentityDigest,
                timeout: ::std::time::Duration,
            ) {
                self.wait_announced(identity, timeout).await;
            }
        }
    };
}
