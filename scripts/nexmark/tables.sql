-- The Nexmark tables over the files `sluice data nexmark DIR` writes ({dir} is filled in), as Flink's nexmark
-- defines their columns, with event time with Nexmark's 4 s of out-of-orderness.
CREATE TABLE person (
  id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING,
  `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{dir}/person', 'format' = 'json');
CREATE TABLE auction (
  id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, `dateTime` TIMESTAMP(3),
  expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{dir}/auction', 'format' = 'json');
CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{dir}/bid', 'format' = 'json');
-- a versioned view (Flink's: the last row per key on the rowtime), for the temporal join check
CREATE VIEW seller_latest_auction AS SELECT seller, id, category, `dateTime` FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY seller ORDER BY `dateTime` DESC) AS rn FROM auction) WHERE rn = 1;
