"""The Nexmark queries Sluice SQL runs, as Flink's nexmark suite writes them (SELECT bodies; the sink is the
harness's): name -> (output columns, primary key of an updating result or None, SELECT).

q6 is Flink's nexmark q6 written as a Top-N, since Flink runs no OVER window ordered by anything but a time
attribute (nor the original's ROWS BETWEEN 10 PRECEDING over an updating input): per seller, the average final
price of the 10 auctions closing last (a Top-N over the updating MAX per auction, then AVG over the Top-N's
changelog).

Not here yet, and why: q12 (processing-time windows), q13 (a bounded side input)."""

from __future__ import annotations

QUERIES: dict[str, tuple[str, str | None, str]] = {
    "q0": ("auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` TIMESTAMP(3), extra STRING", None,
           "SELECT auction, bidder, price, `dateTime`, extra FROM bid"),
    "q1": ("auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), `dateTime` TIMESTAMP(3), extra STRING", None,
           "SELECT auction, bidder, 0.908 * price AS price, `dateTime`, extra FROM bid"),
    "q2": ("auction BIGINT, price BIGINT", None,
           "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"),
    "q3": ("name STRING, city STRING, state STRING, id BIGINT", None,
           "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P ON A.seller = P.id "
           "WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')"),
    "q4": ("id BIGINT, final BIGINT", "id",
           "SELECT Q.category AS id, AVG(Q.final) AS final FROM (SELECT MAX(B.price) AS final, A.category "
           "FROM auction A, bid B WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires "
           "GROUP BY A.id, A.category) Q GROUP BY Q.category"),
    "q6": ("seller BIGINT, avg_final BIGINT", "seller",
           "SELECT seller, AVG(final) AS avg_final FROM (SELECT id, seller, expires, final, ROW_NUMBER() OVER "
           "(PARTITION BY seller ORDER BY expires DESC, id DESC) AS rownum FROM (SELECT A.id, A.seller, A.expires, "
           "MAX(B.price) AS final FROM auction A, bid B WHERE A.id = B.auction AND B.`dateTime` BETWEEN "
           "A.`dateTime` AND A.expires GROUP BY A.id, A.seller, A.expires) Q) WHERE rownum <= 10 GROUP BY seller"),
    "q5": ("auction BIGINT, num BIGINT", None,
           "SELECT AuctionBids.auction, AuctionBids.num FROM (SELECT auction, COUNT(*) AS num, window_start AS "
           "starttime, window_end AS endtime FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, "
           "INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end) AS AuctionBids JOIN (SELECT "
           "MAX(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime FROM (SELECT COUNT(*) AS num, "
           "window_start AS starttime, window_end AS endtime FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), "
           "INTERVAL '2' SECOND, INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end) AS CountBids "
           "GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids ON AuctionBids.starttime = "
           "MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime AND AuctionBids.num >= MaxBids.maxn"),
    "q7": ("auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` TIMESTAMP(3), extra STRING", None,
           "SELECT B.auction, B.bidder, B.price, B.`dateTime`, B.extra FROM bid B JOIN (SELECT MAX(price) AS "
           "maxprice, window_end AS `dateTime` FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), "
           "INTERVAL '10' SECOND)) GROUP BY window_start, window_end) B1 ON B.price = B1.maxprice "
           "WHERE B.`dateTime` BETWEEN B1.`dateTime` - INTERVAL '10' SECOND AND B1.`dateTime`"),
    "q8": ("id BIGINT, name STRING, stime TIMESTAMP(3)", None,
           "SELECT P.id, P.name, P.starttime FROM (SELECT id, name, window_start AS starttime, window_end AS "
           "endtime FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) "
           "GROUP BY id, name, window_start, window_end) P JOIN (SELECT seller, window_start AS starttime, "
           "window_end AS endtime FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) "
           "GROUP BY seller, window_start, window_end) A "
           "ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"),
    "q9": ("id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, "
           "`dateTime` TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra STRING, "
           "auction BIGINT, bidder BIGINT, price BIGINT, bid_dateTime TIMESTAMP(3), bid_extra STRING", "id",
           "SELECT id, itemName, description, initialBid, reserve, `dateTime`, expires, seller, category, extra, "
           "auction, bidder, price, bid_dateTime, bid_extra FROM (SELECT A.*, B.auction, B.bidder, B.price, "
           "B.`dateTime` AS bid_dateTime, B.extra AS bid_extra, ROW_NUMBER() OVER (PARTITION BY A.id "
           "ORDER BY B.price DESC, B.`dateTime` ASC) AS rownum FROM auction A, bid B WHERE A.id = B.auction "
           "AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires) WHERE rownum <= 1"),
    "q10": ("auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` TIMESTAMP(3), extra STRING, dt STRING, "
            "hm STRING", None,
            "SELECT auction, bidder, price, `dateTime`, extra, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd'), "
            "DATE_FORMAT(`dateTime`, 'HH:mm') FROM bid"),
    "q11": ("bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)", None,
            "SELECT bidder, COUNT(*) AS bid_count, window_start AS starttime, window_end AS endtime "
            "FROM TABLE(SESSION(TABLE bid PARTITION BY bidder, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) "
            "GROUP BY bidder, window_start, window_end"),
    "q15": ("`day` STRING, total_bids BIGINT, rank1_bids BIGINT, rank2_bids BIGINT, rank3_bids BIGINT, "
            "total_bidders BIGINT, rank1_bidders BIGINT, rank2_bidders BIGINT, rank3_bidders BIGINT, "
            "total_auctions BIGINT, rank1_auctions BIGINT, rank2_auctions BIGINT, rank3_auctions BIGINT", "`day`",
            "SELECT DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') AS `day`, COUNT(*) AS total_bids, "
            "COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, "
            "COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, "
            "COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids, "
            "COUNT(DISTINCT bidder) AS total_bidders, "
            "COUNT(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders, "
            "COUNT(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders, "
            "COUNT(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders, "
            "COUNT(DISTINCT auction) AS total_auctions, "
            "COUNT(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions, "
            "COUNT(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions, "
            "COUNT(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions "
            "FROM bid GROUP BY DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')"),
    "q17": ("auction BIGINT, `day` STRING, total_bids BIGINT, rank1_bids BIGINT, rank2_bids BIGINT, "
            "rank3_bids BIGINT, min_price BIGINT, max_price BIGINT, avg_price BIGINT, sum_price BIGINT",
            "auction, `day`",
            "SELECT auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') AS `day`, COUNT(*) AS total_bids, "
            "COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, "
            "COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, "
            "COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids, "
            "MIN(price) AS min_price, MAX(price) AS max_price, AVG(price) AS avg_price, SUM(price) AS sum_price "
            "FROM bid GROUP BY auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')"),
    "q18": ("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), "
            "extra STRING", "bidder, auction",
            "SELECT auction, bidder, price, channel, url, `dateTime`, extra FROM (SELECT *, ROW_NUMBER() OVER "
            "(PARTITION BY bidder, auction ORDER BY `dateTime` DESC) AS rank_number FROM bid) "
            "WHERE rank_number <= 1"),
    "q19": ("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), "
            "extra STRING, rank_number BIGINT", "auction, rank_number",
            "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number "
            "FROM bid) WHERE rank_number <= 10"),
    "q20": ("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, bid_dateTime TIMESTAMP(3), "
            "itemName STRING, initialBid BIGINT, reserve BIGINT, auction_dateTime TIMESTAMP(3), "
            "expires TIMESTAMP(3), seller BIGINT, category BIGINT", None,
            "SELECT auction, bidder, price, channel, url, B.`dateTime`, itemName, initialBid, reserve, "
            "A.`dateTime`, expires, seller, category FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id "
            "WHERE A.category = 10"),
    "q21": ("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, channel_id STRING", None,
            "SELECT auction, bidder, price, channel, CASE WHEN LOWER(channel) = 'apple' THEN '0' "
            "WHEN LOWER(channel) = 'google' THEN '1' WHEN LOWER(channel) = 'facebook' THEN '2' "
            "WHEN LOWER(channel) = 'baidu' THEN '3' ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) END "
            "AS channel_id FROM bid WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL OR "
            "LOWER(channel) IN ('apple', 'google', 'facebook', 'baidu')"),
    "q22": ("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, dir1 STRING, dir2 STRING, dir3 STRING",
            None,
            "SELECT auction, bidder, price, channel, SPLIT_INDEX(url, '/', 3) AS dir1, "
            "SPLIT_INDEX(url, '/', 4) AS dir2, SPLIT_INDEX(url, '/', 5) AS dir3 FROM bid"),
}


_HALF_SECOND = "TABLE(TUMBLE(TABLE {}, DESCRIPTOR(`dateTime`), INTERVAL '0.5' SECOND))"
_OVER = "WINDOW w AS (PARTITION BY auction ORDER BY `dateTime` {})"

# SQL constructs beyond the Nexmark queries, over the same tables and checked against Flink the same way
# (`--queries over_rows,...`): OVER aggregations, window Top-N and deduplication, DISTINCT, WITH and UNION, window
# joins, regular joins of updating inputs, LIMIT without ORDER BY (at parallelism 1: the first rows of the file),
# the temporal join (the latest auction of each bid's bidder as a seller, at the bid's time). Half-second
# windows: the small generated sets span a few seconds of event time.
CHECKS: dict[str, tuple[str, str | None, str]] = {
    "over_rows": ("auction BIGINT, price BIGINT, t TIMESTAMP(3), s BIGINT, c BIGINT, m BIGINT", None,
                  "SELECT auction, price, `dateTime`, SUM(price) OVER w, COUNT(*) OVER w, MAX(price) OVER w FROM bid "
                  + _OVER.format("ROWS BETWEEN 2 PRECEDING AND CURRENT ROW")),
    "over_range": ("auction BIGINT, price BIGINT, t TIMESTAMP(3), s BIGINT, c BIGINT, a BIGINT", None,
                   "SELECT auction, price, `dateTime`, SUM(price) OVER w, COUNT(*) OVER w, AVG(price) OVER w FROM bid "
                   + _OVER.format("RANGE BETWEEN INTERVAL '0.1' SECOND PRECEDING AND CURRENT ROW")),
    "over_unbounded": ("bidder BIGINT, price BIGINT, mn BIGINT, c BIGINT", None,
                       "SELECT bidder, price, MIN(price) OVER (PARTITION BY bidder ORDER BY `dateTime`), "
                       "COUNT(*) OVER (PARTITION BY bidder ORDER BY `dateTime`) FROM bid"),
    "window_top_n": ("auction BIGINT, bidder BIGINT, price BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3), rn BIGINT", None,
                     "SELECT * FROM (SELECT auction, bidder, price, window_start, window_end, ROW_NUMBER() OVER "
                     "(PARTITION BY window_start, window_end ORDER BY price DESC) AS rn FROM "
                     + _HALF_SECOND.format("bid") + ") WHERE rn <= 3"),
    "window_top_n_agg": ("ws TIMESTAMP(3), auction BIGINT, n BIGINT", None,
                         "SELECT window_start, auction, n FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY "
                         "window_start, window_end ORDER BY n DESC, auction ASC) AS rn FROM (SELECT auction, "
                         "window_start, window_end, COUNT(*) AS n FROM " + _HALF_SECOND.format("bid")
                         + " GROUP BY auction, window_start, window_end)) WHERE rn <= 2"),
    "window_dedup": ("auction BIGINT, bidder BIGINT, price BIGINT, t TIMESTAMP(3), ws TIMESTAMP(3)", None,
                     "SELECT auction, bidder, price, `dateTime`, window_start FROM (SELECT *, ROW_NUMBER() OVER "
                     "(PARTITION BY window_start, window_end, auction ORDER BY `dateTime` DESC) AS rn FROM "
                     + _HALF_SECOND.format("bid") + ") WHERE rn = 1"),
    "distinct": ("bidder BIGINT, channel STRING", "bidder, channel", "SELECT DISTINCT bidder, channel FROM bid"),
    "with_union": ("id BIGINT", "id",
                   "WITH a AS (SELECT auction AS id FROM bid WHERE price > 1000000) SELECT id FROM a UNION "
                   "SELECT seller FROM auction"),
    "window_join": ("auction BIGINT, price BIGINT, seller BIGINT, ws TIMESTAMP(3)", None,
                    "SELECT B.auction, B.price, A.seller, B.window_start FROM (SELECT * FROM "
                    + _HALF_SECOND.format("bid") + ") B JOIN (SELECT * FROM " + _HALF_SECOND.format("auction")
                    + ") A ON B.auction = A.id AND B.window_start = A.window_start AND B.window_end = A.window_end"),
    "window_left_join": ("id BIGINT, seller BIGINT, price BIGINT, ws TIMESTAMP(3)", None,
                         "SELECT A.id, A.seller, B.price, A.window_start FROM (SELECT * FROM "
                         + _HALF_SECOND.format("auction") + ") A LEFT JOIN (SELECT * FROM "
                         + _HALF_SECOND.format("bid") + ") B ON B.auction = A.id AND B.window_start = "
                         "A.window_start AND B.window_end = A.window_end"),
    "join_updating": ("id BIGINT, seller BIGINT, final BIGINT", "id",
                      "SELECT A.id, A.seller, M.final FROM auction A LEFT JOIN (SELECT auction, MAX(price) AS final "
                      "FROM bid GROUP BY auction) M ON A.id = M.auction"),
    "join_two_updating": ("bidder BIGINT, bids BIGINT, auctions BIGINT", "bidder",
                          "SELECT B.bidder, B.n, S.n FROM (SELECT bidder, COUNT(*) AS n FROM bid GROUP BY bidder) B "
                          "JOIN (SELECT seller, COUNT(*) AS n FROM auction GROUP BY seller) S ON B.bidder = S.seller"),
    "limit": ("auction BIGINT, bidder BIGINT, price BIGINT", None, "SELECT auction, bidder, price FROM bid LIMIT 7"),
    "temporal_join": ("auction BIGINT, bidder BIGINT, t TIMESTAMP(3), latest BIGINT, category BIGINT", None,
                      "SELECT B.auction, B.bidder, B.`dateTime`, A.id, A.category FROM bid AS B LEFT JOIN "
                      "seller_latest_auction FOR SYSTEM_TIME AS OF B.`dateTime` AS A ON B.bidder = A.seller"),
}
