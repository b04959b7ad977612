-- Schema and data of the H2 workload (tests/tests/real_apps/): run once, then round.sql runs
-- until the test stops the JVM.
CREATE TABLE customers(id INT PRIMARY KEY, name VARCHAR(40), region VARCHAR(10), since DATE);
INSERT INTO customers SELECT X, 'customer-' || X, ARRAY['north','south','east','west','centre'][MOD(X, 5) + 1],
    DATEADD('DAY', -MOD(X * 7, 3650), DATE '2024-01-01') FROM SYSTEM_RANGE(1, 5000);
CREATE TABLE products(id INT PRIMARY KEY, name VARCHAR(40), category VARCHAR(20), price DECIMAL(10,2));
INSERT INTO products SELECT X, 'product-' || X, 'category-' || MOD(X, 17), (MOD(X * 37, 1000) + 1) / 10.0
    FROM SYSTEM_RANGE(1, 800);
CREATE TABLE orders(id BIGINT PRIMARY KEY, customer INT, product INT, quantity INT, placed TIMESTAMP, note VARCHAR(60));
CREATE INDEX orders_customer ON orders(customer);
CREATE INDEX orders_product ON orders(product);
CREATE SEQUENCE order_ids;
