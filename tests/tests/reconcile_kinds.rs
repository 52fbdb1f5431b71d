//! Reconciliation's record-only kinds on DynamoDB Local: each bad state is
//! built directly in the table (a write the normal flow would follow with
//! another, left out; or a row written by hand), then the table is read
//! the way the reconcile function reads it.

use order_core::aws::dynamo::{keys, n, s};
use order_core::domain::*;
use order_core::handlers::reconcile::run_reconcile;
use order_core::ports::StatementLine;
use order_core::ports::*;
use order_core::store::*;
use order_core::usecases::reconcile::{reconcile, Bounds, Report};
use order_core::usecases::refunds::REFUND_REDRIVE_AFTER;
use serde_json::json;
use std::time::Duration;
use system_tests::fixtures::{self, one_line, T0};

const WINDOW: Duration = Duration::from_secs(60);

system_tests::world_of!(World);

impl World {
    async fn new() -> Self {
        Self(fixtures::World::new(&["A", "B"], 10).await)
    }

    async fn order(&self, sku: &str, coupon: Option<&str>) -> Order {
        let mut body = one_line("u1", sku, 2, 100);
        if let Some(c) = coupon {
            body["coupon_id"] = json!(c);
        }
        self.create(WINDOW, &body).await
    }

    async fn report(&self, at: Timestamp, ledger: Option<&[StatementLine]>) -> Report {
        let snapshot = self.store.scan_snapshot().await.unwrap();
        let statement = ledger.map(|l| Statement { since: None, until: None, lines: l.to_vec() });
        reconcile(&snapshot, statement.as_ref(), &Bounds::default(), at)
    }
}

fn kinds_for(report: &Report, order: &Order) -> Vec<&'static str> {
    report.discrepancies.iter().filter(|d| d.order_id == order.order_id.as_str()).map(|d| d.kind.as_str()).collect()
}

fn success() -> Evidence {
    Evidence {
        at: Timestamp::from_unix_millis(T0 + 1_000),
        source: "t".into(),
        status: PaymentStatus::Succeeded,
        detail: None,
    }
}

#[tokio::test]
async fn a_closed_order_still_holding_stock_and_a_coupon_lock_is_reported_once_past_the_grace() {
    let w = World::new().await;
    let coupon = system_tests::fixtures::available_coupon("C1", "u1", Timestamp::from_unix_millis(T0 + 86_400_000));
    w.store.put_coupon(&coupon).await.unwrap();
    let o = w.order("A", Some("C1")).await;
    // Closed; the release that should follow never ran.
    assert_eq!(w.store.close_unpaid(&o, o.expire_at).await.unwrap(), Cas::Applied);
    let fresh = w.report(o.expire_at.plus(Duration::from_secs(5)), None).await;
    assert_eq!(kinds_for(&fresh, &o), Vec::<&str>::new(), "a release in flight is not a discrepancy");
    let late = w.report(o.expire_at.plus(Bounds::default().effects_pending).plus(Duration::from_secs(1)), None).await;
    assert_eq!(kinds_for(&late, &o), ["reservation_held_on_closed_order", "coupon_locked_on_closed_order"]);
    assert_eq!(late.counts["reservation_held_on_closed_order"], 1);
    assert_eq!(late.counts["coupon_locked_on_closed_order"], 1);
}

#[tokio::test]
async fn a_paid_order_whose_reservation_was_never_confirmed_is_reported() {
    let w = World::new().await;
    let o = w.order("A", None).await;
    let a = w.attempt(&o).await;
    let o = w.now_order(&o).await;
    assert_eq!(w.store.settle_success(&o, &a, "tx", success(), None, "").await.unwrap(), SettleResult::Paid);
    // Paid; the settle that confirms the stock never ran.
    let late = w.report(success().at.plus(Bounds::default().effects_pending).plus(Duration::from_secs(1)), None).await;
    assert_eq!(kinds_for(&late, &o), ["reservation_unconfirmed_on_paid_order"]);
    let fresh = w.report(success().at.plus(Duration::from_secs(1)), None).await;
    assert_eq!(kinds_for(&fresh, &o), Vec::<&str>::new());
}

#[tokio::test]
async fn an_order_left_open_long_past_its_expiry_is_reported() {
    let w = World::new().await;
    let o = w.order("A", None).await;
    let soon = w.report(o.expire_at.plus(Duration::from_secs(30)), None).await;
    assert_eq!(kinds_for(&soon, &o), Vec::<&str>::new(), "a close on its way");
    let bound = Bounds::default().open_past_expiry;
    let late = w.report(o.expire_at.plus(bound).plus(Duration::from_secs(1)), None).await;
    assert_eq!(kinds_for(&late, &o), ["order_open_past_expiry"]);
    let custom = Bounds { open_past_expiry: Duration::from_secs(10), ..Bounds::default() };
    let snapshot = w.store.scan_snapshot().await.unwrap();
    let r = reconcile(&snapshot, None, &custom, o.expire_at.plus(Duration::from_secs(30)));
    assert_eq!(kinds_for(&r, &o), ["order_open_past_expiry"], "the bound is configurable");
}

#[tokio::test]
async fn a_stale_pending_refund_is_reported_and_no_longer_defers_the_funds_identity() {
    let w = World::new().await;
    let o = w.order("A", None).await;
    let a = w.attempt(&o).await;
    let o = w.now_order(&o).await;
    let lease = ClosingLease { started_at: o.expire_at, owner: "w".into(), lease_until: o.expire_at, resumes: 0 };
    w.store.begin_closing(&o, &lease, o.expire_at).await.unwrap();
    let closing = w.now_order(&o).await;
    w.store.close_after_check(&closing, o.expire_at, "t").await.unwrap();
    let closed = w.now_order(&o).await;
    let mut late = success();
    late.at = o.expire_at.plus(Duration::from_secs(5));
    assert_eq!(
        w.store.settle_success(&closed, &a, "tx", late.clone(), None, "n").await.unwrap(),
        SettleResult::RefundPending
    );
    let ledger = [StatementLine {
        payment_id: a.payment_id.clone(),
        order_id: o.order_id.clone(),
        amount: a.amount,
        currency: a.currency.clone(),
        status: PaymentStatus::Succeeded,
        refund_id: None,
        refunded_amount: 0,
        created_at: None,
    }];
    // The release is not this test's concern: look past it by checking
    // only the refund kinds.
    let refund_kinds = |r: &Report| {
        kinds_for(r, &o)
            .into_iter()
            .filter(|k| *k == "refund_pending_stale" || *k == "funds_identity_violation")
            .collect::<Vec<_>>()
    };
    let fresh = w.report(late.at.plus(Duration::from_secs(60)), Some(&ledger)).await;
    assert_eq!(refund_kinds(&fresh), Vec::<&str>::new());
    assert_eq!(fresh.refunds_pending, 1, "a fresh refund defers the identity");
    let stale = w.report(late.at.plus(REFUND_REDRIVE_AFTER), Some(&ledger)).await;
    assert_eq!(refund_kinds(&stale), ["refund_pending_stale", "funds_identity_violation"]);
    assert_eq!(stale.refunds_pending, 0);
    let without_channel = w.report(late.at.plus(REFUND_REDRIVE_AFTER), None).await;
    assert_eq!(refund_kinds(&without_channel), ["refund_pending_stale"], "a record-only kind");
}

#[tokio::test]
async fn a_sku_whose_reserved_count_differs_from_its_reservations_is_reported() {
    let w = World::new().await;
    let o = w.order("A", None).await;
    w.order("B", None).await;
    // Someone set the count by hand: 2 are held by the order, 5 are counted.
    w.store
        .client()
        .update_item()
        .table_name(w.store.table())
        .key("pk", s(keys::sku(&Sku::parse("A").unwrap())))
        .key("sk", s(keys::STOCK_SK))
        .update_expression("SET reserved = :r")
        .expression_attribute_values(":r", n(5))
        .send()
        .await
        .unwrap();
    let r = w.report(o.created_at, None).await;
    let found: Vec<_> = r.discrepancies.iter().filter(|d| d.kind == "stock_reserved_mismatch").collect();
    assert_eq!(found.len(), 1, "B is consistent: {found:?}");
    assert_eq!(found[0].key.as_deref(), Some("SKU#A/STOCK"));
    assert!(found[0].detail.contains("reserved 5") && found[0].detail.contains("sum to 2"), "{}", found[0].detail);
    assert_eq!(r.stocks_checked, 2);
}

#[tokio::test]
async fn an_undecodable_row_is_reported_by_its_key_and_the_run_goes_on() {
    let w = World::new().await;
    let o = w.order("A", None).await;
    let put = |pk: &str, sk: &str, attrs: &[(&str, &str)]| {
        let mut req = w.store.client().put_item().table_name(w.store.table()).item("pk", s(pk)).item("sk", s(sk));
        for (k, v) in attrs {
            req = req.item(*k, s(*v));
        }
        req.send()
    };
    put("ORDER#ord_bad", "ORDER", &[("entity", "ORDER"), ("status", "HALF_PAID")]).await.unwrap();
    put(&keys::order(&o.order_id), "RES#STOCK#Z", &[("entity", "RESERVATION"), ("sku", "Z"), ("qty", "lots")])
        .await
        .unwrap();
    w.clock.set(o.expire_at.plus(Bounds::default().open_past_expiry).plus(Duration::from_secs(1)).unix_millis());
    let report =
        run_reconcile(&w.store, None::<&order_core::aws::sandbox::SandboxChannel>, &Bounds::default(), &w.clock)
            .await
            .expect("the run does not fail");
    assert_eq!(report["counts"]["undecodable_record"], 2, "{report:#}");
    let keys: Vec<&str> = report["discrepancies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"] == "undecodable_record")
        .map(|d| d["key"].as_str().unwrap())
        .collect();
    assert!(keys.contains(&"ORDER#ord_bad/ORDER"), "{keys:?}");
    assert!(keys.contains(&format!("{}/RES#STOCK#Z", keys::order(&o.order_id)).as_str()), "{keys:?}");
    // The rest of the table was still checked, the good order included.
    assert_eq!(report["orders_checked"], 1);
    assert_eq!(report["counts"]["order_open_past_expiry"], 1, "{report:#}");
}
